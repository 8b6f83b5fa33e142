"""Evaluation, prediction and metrics (issue 15, item 4): ``Trainer.predict`` without labels,
the default metrics of each loss kind against plain-numpy oracles written here, added metrics,
and `graphc train`'s choice of evaluation arrays (``--eval-data``, NAME_val over NAME_test)."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from graphc.errors import InputError

from cli_util import one_line_error, run_cli
from trainer_models import blobs

CLASSES = 10


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, CLASSES)

    def forward(self, x):
        return {"logits": self.fc(x)}


@pytest.fixture(scope="module")
def classifier():
    model = gc.capture(Classifier(), x=gc.spec("float32", ("N", 8)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))
    return arts


def _topk_oracle(logits: np.ndarray, labels: np.ndarray, k: int) -> float:
    """Label among the k largest: fewer than k classes score strictly higher than it."""
    hits = [sum(row[c] > row[label] for c in range(len(row))) < k for row, label in zip(logits, labels)]
    return float(np.mean(hits))


def test_predict_needs_only_the_data_inputs(classifier):
    trainer = gc.Trainer(classifier, backend="numpy")
    data = blobs(32, classes=CLASSES)
    trainer.step(data)
    out = trainer.predict({"x": data["x"]})
    assert set(out) == {"logits"}
    w, b = trainer.params["fc.weight"], trainer.params["fc.bias"]
    np.testing.assert_allclose(out["logits"], data["x"] @ w.T + b, rtol=1e-5, atol=1e-6)
    with_labels = trainer.predict(data)
    assert set(with_labels) == {"loss", "logits"}
    np.testing.assert_allclose(with_labels["logits"], out["logits"], rtol=1e-6)
    with pytest.raises(InputError, match="predict needs the data inputs only"):
        trainer.evaluate({"x": data["x"]})


def test_classifier_metrics_are_accuracy_and_top5(classifier):
    trainer = gc.Trainer(classifier, backend="numpy")
    data = blobs(64, classes=CLASSES, seed=3)
    metrics = trainer.evaluate(data)
    logits = trainer.predict({"x": data["x"]})["logits"]
    assert set(metrics) == {"loss", "accuracy", "top5_accuracy"}
    assert metrics["accuracy"] == pytest.approx(_topk_oracle(logits, data["y"], 1))
    assert metrics["top5_accuracy"] == pytest.approx(_topk_oracle(logits, data["y"], 5))
    assert metrics["top5_accuracy"] >= metrics["accuracy"]


def test_ignored_labels_do_not_count():
    from graphc.runtime.metrics import compute

    logits = np.array([[2.0, 1.0], [0.0, 3.0], [5.0, 0.0]], np.float32)
    labels = np.array([0, 0, -100])
    loss = {"kind": "cross_entropy", "output": "logits", "label": "y", "options": {"ignore_index": -100}}
    assert compute(loss, {"logits": logits}, {"y": labels}) == {"accuracy": 0.5}


@pytest.mark.parametrize("kind", ["cross_entropy", "mse"])
def test_built_in_metrics_add_up_over_shards_by_their_examples(kind):
    """What data-parallel workers send: each shard's metrics times its examples (``sums``) add
    up to the whole batch's, for the built-ins (``splits``), a shard of ignored labels only
    included; a user's metric, which may be a max, does not split."""
    from graphc.runtime.averaging import examples
    from graphc.runtime.metrics import splits, sums

    rng = np.random.default_rng(2)
    pred = rng.standard_normal((11, 6))
    if kind == "cross_entropy":
        target, chosen = rng.integers(0, 6, 11), {"accuracy": gc.metrics.accuracy, "top3": gc.metrics.top_k_accuracy(3)}
        target[:4] = -100
    else:
        target, chosen = rng.standard_normal((11, 6)), {"mse": gc.metrics.mse, "mae": gc.metrics.mae}
    loss = {"kind": kind, "output": "p", "label": "t", "options": {"ignore_index": -100}}
    assert all(splits(fn) for fn in chosen.values())
    whole = sums(loss, {"p": pred}, {"t": target}, chosen, examples(loss, {"t": target}, 11))
    parts = [sums(loss, {"p": pred[lo:hi]}, {"t": target[lo:hi]}, chosen, examples(loss, {"t": target[lo:hi]}, hi - lo))
             for lo, hi in ((0, 4), (4, 8), (8, 11))]
    for name, value in whole.items():
        assert sum(p[name] for p in parts) == pytest.approx(value, rel=1e-12), name
    assert not splits(lambda p, t: float(p.max()))


def test_regression_metrics_are_mse_and_mae():
    model = gc.capture(nn.Linear(8, 2), x=gc.spec("float32", ("N", 8)))
    arts = gc.training.generate(model, gc.losses.huber("output", label="t"), gc.optim.SGD(0.01))
    trainer = gc.Trainer(arts, backend="numpy")
    rng = np.random.default_rng(0)
    batch = {"x": rng.standard_normal((16, 8)).astype(np.float32), "t": rng.standard_normal((16, 2)).astype(np.float32)}
    metrics = trainer.evaluate(batch)
    pred = trainer.predict({"x": batch["x"]})["output"].astype(np.float64)
    assert set(metrics) == {"loss", "mse", "mae"}
    assert metrics["mse"] == pytest.approx(((pred - batch["t"]) ** 2).mean())
    assert metrics["mae"] == pytest.approx(np.abs(pred - batch["t"]).mean())


@pytest.mark.parametrize("loss, metric", [("huber", "accuracy"), ("mse", "top5_accuracy"),
                                          ("cross_entropy", "mse"), ("bce_with_logits", "mae")])
def test_a_built_in_metric_that_does_not_fit_the_loss_is_refused(loss, metric):
    """An accuracy of an mse output (the sign of a regression) was reported as if it meant something."""
    model = gc.capture(nn.Linear(8, 2), x=gc.spec("float32", ("N", 8)))
    arts = gc.training.generate(model, getattr(gc.losses, loss)("output", label="t"), gc.optim.SGD(0.01))
    with pytest.raises(ValueError, match=f"metric '{metric}' does not fit a {loss} loss"):
        gc.Trainer(arts, backend="numpy", metrics=metric)
    gc.Trainer(arts, backend="numpy", metrics={metric: lambda p, t: 0.0})  # the user's own: theirs to judge


def _loss_oracle(kind: str, reduction: str, pred: np.ndarray, target: np.ndarray) -> float:
    """The loss of the whole set in numpy (cross-entropy: labels of -100 left out)."""
    if kind == "cross_entropy":
        keep = target != -100
        shifted = pred[keep] - pred[keep].max(axis=1, keepdims=True)
        per = np.log(np.exp(shifted).sum(axis=1)) - shifted[np.arange(keep.sum()), target[keep]]
    else:
        per = np.square(pred - target) if kind == "mse" else np.abs(pred - target)
    return float(per.sum() if reduction == "sum" else per.mean())


@pytest.mark.parametrize("kind, reduction", [("cross_entropy", "mean"), ("cross_entropy", "sum"), ("mse", "mean"),
                                             ("l1", "sum")])
def test_evaluate_loader_gives_the_whole_set_as_one_batch(kind, reduction):
    # batches of 4 over 10 rows, 3 of the first batch's 4 labels ignored: weighted by rows, the
    # cross-entropy was 1.0196 for 1.0468, the summed one 2.46 for the total 7.33
    out = CLASSES if kind == "cross_entropy" else 2
    model = gc.capture(nn.Linear(8, out, dtype="float64"), x=gc.spec("float64", ("N", 8)))
    loss = getattr(gc.losses, kind)("output", label="y", reduction=reduction)
    trainer = gc.Trainer(gc.training.generate(model, loss, gc.optim.SGD(0.1)), backend="numpy")
    rng = np.random.default_rng(4)
    data = {"x": rng.standard_normal((10, 8))}
    if kind == "cross_entropy":
        data["y"] = rng.integers(0, CLASSES, 10)
        data["y"][1:4] = -100
    else:
        data["y"] = rng.standard_normal((10, out))
    loader = trainer.evaluate_loader(gc.data.DataLoader(data, batch_size=4, shuffle=False))
    pred = trainer.predict({"x": data["x"]})["output"]
    assert loader["loss"] == pytest.approx(_loss_oracle(kind, reduction, pred, data["y"]), rel=1e-12)
    whole = trainer.evaluate(data)
    assert set(loader) == set(whole)
    for name in whole:
        assert loader[name] == pytest.approx(whole[name], rel=1e-12), name


def test_added_metrics_by_name_and_callable(classifier):
    def worst_margin(pred, target):
        return float((pred.max(axis=1) - pred[np.arange(len(target)), target]).max())

    gc.metrics.register("top3_accuracy", gc.metrics.top_k_accuracy(3))
    trainer = gc.Trainer(classifier, backend="numpy", metrics=["top3_accuracy", worst_margin])
    data = blobs(40, classes=CLASSES, seed=5)
    metrics = trainer.evaluate(data)
    logits = trainer.predict({"x": data["x"]})["logits"]
    assert set(metrics) == {"loss", "top3_accuracy", "worst_margin"}
    assert metrics["top3_accuracy"] == pytest.approx(_topk_oracle(logits, data["y"], 3))
    assert metrics["worst_margin"] == pytest.approx(worst_margin(logits, data["y"]))
    with pytest.raises(ValueError, match="unknown metric 'f1'.*registered: accuracy"):
        gc.Trainer(classifier, backend="numpy", metrics=["f1"])
    # one name or one callable alone (a name once read letter by letter: "unknown metric 't'")
    for one, name in (("top3_accuracy", "top3_accuracy"), (worst_margin, "worst_margin")):
        assert set(gc.Trainer(classifier, backend="numpy", metrics=one).evaluate(data)) == {"loss", name}


@pytest.fixture()
def train_dir(tmp_path, classifier):
    classifier.save(tmp_path / "arts")
    train, val, test = blobs(64, classes=CLASSES), blobs(32, classes=CLASSES, seed=1), blobs(16, classes=CLASSES, seed=2)
    np.savez(tmp_path / "data.npz", x_train=train["x"], y_train=train["y"], x_val=val["x"], y_val=val["y"],
             x_test=test["x"], y_test=test["y"])
    np.savez(tmp_path / "held.npz", x=test["x"], y=test["y"])
    return tmp_path


def _train(capsys, root, *extra):
    return run_cli(capsys, "train", root / "arts", "--data", root / "data.npz", "--epochs", "1", "--batch-size", "16",
                   "--backend", "numpy", "--no-progress", *extra)


def test_train_prefers_the_validation_split_and_takes_eval_data(capsys, train_dir):
    r = _train(capsys, train_dir)
    assert r.code == 0, r.err
    assert "evaluating on x_val, y_val of" in r.out and "eval top5_accuracy" in r.out
    r = _train(capsys, train_dir, "--eval-data", train_dir / "held.npz", "--metric", "accuracy")
    assert r.code == 0, r.err
    assert f"evaluating on x, y of --eval-data {train_dir / 'held.npz'}" in r.out and "eval accuracy" in r.out
    assert "top5" not in r.out


def test_eval_data_takes_one_set_of_rows_for_every_input(capsys, train_dir, classifier):
    """x_val was once paired with y (other rows): a wrong evaluation, said nowhere."""
    held = dict(np.load(train_dir / "held.npz"))
    val = blobs(32, classes=CLASSES, seed=1)
    np.savez(train_dir / "mixed.npz", x_val=val["x"], y_val=val["y"], y=held["y"])
    r = _train(capsys, train_dir, "--eval-data", train_dir / "mixed.npz", "--metric", "accuracy")
    assert r.code == 0, r.err
    assert f"evaluating on x_val, y_val of --eval-data {train_dir / 'mixed.npz'}" in r.out
    np.savez(train_dir / "split.npz", x_val=val["x"], y=held["y"])
    err = one_line_error(_train(capsys, train_dir, "--eval-data", train_dir / "split.npz"))
    assert "the inputs' arrays are from different sets" in err and "give every input with one suffix: x, y; " in err


def test_train_eval_data_missing_an_input_is_one_line(capsys, train_dir):
    np.savez(train_dir / "nolabels.npz", x=np.zeros((4, 8), np.float32))
    err = one_line_error(_train(capsys, train_dir, "--eval-data", train_dir / "nolabels.npz"))
    assert "--eval-data" in err and "'y'" in err and "'y_val'" in err
    err = one_line_error(_train(capsys, train_dir, "--metric", "nope"))
    assert "unknown metric 'nope'" in err
    err = one_line_error(_train(capsys, train_dir, "--metric", "mae"))  # logits [N, 10] against class ids [N]
    assert "metric 'mae' does not fit a cross_entropy loss: it is for mse and l1 and huber losses" in err


def test_train_a_model_of_fixed_batch_size_with_eval_arrays(capsys, tmp_path):
    """Its eval loader was made of batches of 256, which the model cannot take, and its ragged
    data asked for drop_last=True, which the CLI has no option for."""
    model = gc.capture(nn.Linear(8, 3), x=gc.spec("float32", (8, 8)))
    gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(0.1)).save(tmp_path / "arts")
    train, val = blobs(20, classes=3), blobs(12, classes=3, seed=1)
    np.savez(tmp_path / "data.npz", x=train["x"], y=train["y"], x_val=val["x"], y_val=val["y"])
    r = _train(capsys, tmp_path, "--batch-size", "8")
    assert r.code == 0, r.err
    assert "the model takes batches of exactly 8: the last 4 of the 20 samples of --data are left out" in r.out
    assert "the last 4 of the 12 samples of x_val, y_val of" in r.out and "eval accuracy" in r.out
    err = one_line_error(_train(capsys, tmp_path, "--batch-size", "4"))
    assert "--batch-size 4: the model takes batches of exactly 8" in err


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_evaluate_loader_counts_a_batch_of_ignored_labels_only_as_nothing(backend):
    """A batch whose every label is the ignore index has no example to count: evaluate_loader (and
    fit's evaluation) once refused it (the public evaluate's check). The set's loss and accuracy
    are torch's over the labels not ignored."""
    torch = pytest.importorskip("torch")
    model = gc.capture(nn.Linear(8, CLASSES, dtype="float64"), x=gc.spec("float64", ("N", 8)))
    arts = gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.SGD(0.1))
    trainer = gc.Trainer(arts, backend=backend)
    rng = np.random.default_rng(7)
    data = {"x": rng.standard_normal((6, 8)), "y": rng.integers(0, CLASSES, 6)}
    data["y"][2:4] = -100  # batch 1 of the batches of 2, and batches 2 and 3 of those of 1
    logits = torch.from_numpy(trainer.predict({"x": data["x"]})["output"])
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(data["y"])).item()
    kept = data["y"] != -100
    accuracy = float((logits.argmax(1).numpy()[kept] == data["y"][kept]).mean())
    for size in (1, 2, 4):
        result = trainer.evaluate_loader(gc.data.DataLoader(data, batch_size=size, shuffle=False))
        assert result["loss"] == pytest.approx(loss, rel=1e-12), size
        assert result["accuracy"] == pytest.approx(accuracy, rel=1e-12), size
    history = trainer.fit(gc.data.DataLoader(data, batch_size=6), 1, progress=False, quiet=True,
                          eval_loader=gc.data.DataLoader(data, batch_size=1, shuffle=False))
    logits = torch.from_numpy(trainer.predict({"x": data["x"]})["output"])
    assert history.epochs[0].eval["loss"] == pytest.approx(
        torch.nn.functional.cross_entropy(logits, torch.from_numpy(data["y"])).item(), rel=1e-12)
    ignored = {k: v[2:4] for k, v in data.items()}  # torch's mean over them is NaN: refused, naming the loader
    for loader in (gc.data.DataLoader(ignored, batch_size=1), [ignored]):
        with pytest.raises(gc.InputError, match="no sample of the eval loader counts in the loss"):
            trainer.evaluate_loader(loader)
