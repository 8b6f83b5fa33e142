"""uint8 class labels: torch 2.13's cross_entropy takes Byte targets as Long ones and refuses int32;
the Trainer, the DataLoader and `graphc train` cast uint8 labels to the int64 label input."""

import importlib.util

import numpy as np
import pytest

import graphc as gc
from ray_util import ray_cluster  # noqa: F401 - the module's fixture
from trainer_models import BNNet

RNG = np.random.default_rng(0)
BACKENDS = ["numpy", "ort-cpu"]


def _case(ignore_index: int = -100):
    model = gc.capture(BNNet(), seed=0, x=gc.spec("float32", ("N", 8)))
    loss = gc.losses.cross_entropy("logits", label="y", ignore_index=ignore_index)
    x = RNG.standard_normal((12, 8)).astype(np.float32)
    return gc.training.generate(model, loss, gc.optim.SGD(0.1)), x, RNG.integers(0, 3, 12).astype(np.uint8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_uint8_labels_train_and_evaluate_as_int64_labels_and_torchs_byte_targets(backend):
    torch = pytest.importorskip("torch")
    arts, x, labels = _case(ignore_index=255)
    labels[[1, 7]] = 255  # a segmentation mask's "void": ignored, as by torch on Byte targets
    byte, wide = gc.Trainer(arts, backend=backend), gc.Trainer(arts, backend=backend)
    logits = byte.predict({"x": x})["logits"]
    want = torch.nn.functional.cross_entropy(torch.from_numpy(logits), torch.from_numpy(labels),
                                             ignore_index=255).item()
    assert byte.evaluate({"x": x, "y": labels})["loss"] == pytest.approx(want, rel=1e-6)
    for _ in range(2):
        assert byte.step({"x": x, "y": labels}) == wide.step({"x": x, "y": labels.astype(np.int64)})
    for name, value in wide.params.items():
        np.testing.assert_array_equal(byte.params[name], value, err_msg=name)
    loader = gc.data.DataLoader({"x": x, "y": labels}, batch_size=4, seed=1)
    history = byte.fit(loader, 1, eval_loader=loader, progress=False, quiet=True)
    wide.fit(gc.data.DataLoader({"x": x, "y": labels.astype(np.int64)}, batch_size=4, seed=1), 1,
             eval_loader=[{"x": x, "y": labels.astype(np.int64)}], progress=False, quiet=True)
    for name, value in wide.params.items():
        np.testing.assert_array_equal(byte.params[name], value, err_msg=name)
    assert np.isfinite(history.epochs[-1].eval["loss"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_uint8_labels_past_the_classes_are_refused_as_torch_and_int32_still_is(backend):
    torch = pytest.importorskip("torch")
    arts, x, labels = _case()
    labels[4] = 200
    trainer = gc.Trainer(arts, backend=backend)
    logits = torch.from_numpy(trainer.predict({"x": x})["logits"])
    with pytest.raises(IndexError, match="Target 200 is out of bounds"):
        torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels))
    with pytest.raises(gc.InputError, match=r"a train step: label 'y' holds 200 at \(4,\)"):
        trainer.step({"x": x, "y": labels})
    with pytest.raises(gc.InputError, match=r"the training loader: label 'y' holds 200 at \(4,\)"):
        trainer.fit(gc.data.DataLoader({"x": x, "y": labels}, batch_size=4), 1, progress=False, quiet=True)
    with pytest.raises(RuntimeError, match="expected target dtype to be Long or Byte, but got Int"):
        torch.nn.functional.cross_entropy(logits, torch.from_numpy(labels % 3).int())
    with pytest.raises(gc.InputError, match="dtype int32 is not int64"):
        trainer.step({"x": x, "y": (labels % 3).astype(np.int32)})
    with pytest.raises(gc.InputError, match="array 'y': expected dtype int64"):
        trainer.fit(gc.data.DataLoader({"x": x, "y": (labels % 3).astype(np.int32)}, batch_size=4), 1,
                    progress=False, quiet=True)
    assert trainer.step_count == 0


def test_uint8_data_inputs_are_not_cast():
    """Only a cross-entropy's labels take uint8: an int64 data input (token ids) still says the dtype."""
    loader = gc.data.DataLoader({"ids": np.zeros(4, np.uint8)}, batch_size=2)
    with pytest.raises(gc.InputError, match="array 'ids': expected dtype int64"):
        loader.check_against([gc.spec("int64", ("N",), name="ids")])


def test_graphc_train_takes_uint8_labels(tmp_path, capsys):
    """An .npz of uint8 labels trains as the int64 labels did (it was refused: 'save it as int64')."""
    from cli_util import run_cli, workspace

    root = workspace(tmp_path)
    data = dict(np.load(root / "data.npz"))
    np.savez(root / "byte.npz", **{**data, "y": data["y"].astype(np.uint8)})
    run = ["train", root / "arts", "--epochs", 1, "--batch-size", 8, "--backend", "numpy", "--seed", 3, "--quiet"]
    assert run_cli(capsys, *run, "--data", root / "byte.npz", "--checkpoint", root / "byte").code == 0
    assert run_cli(capsys, *run, "--data", root / "data.npz", "--checkpoint", root / "wide").code == 0
    byte, wide = (gc.Trainer(root / name, backend="numpy") for name in ("byte", "wide"))
    assert byte.step_count == wide.step_count == 8
    for name, value in wide.params.items():
        np.testing.assert_array_equal(byte.params[name], value, err_msg=name)


@pytest.mark.xdist_group("ray")
@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")
def test_workers_read_uint8_labels_from_the_loader_as_int64_labels(ray_cluster):
    """In fit, each worker reads its shard from the loader and casts the uint8 labels itself."""
    arts, x, labels = _case()
    params = []
    for y in (labels, labels.astype(np.int64)):
        trainer = gc.Trainer(arts, backend="ort-cpu", workers=2, num_cpus=0.5, timeout_s=120)
        trainer.fit(gc.data.DataLoader({"x": x, "y": y}, batch_size=6, seed=1), 1, progress=False, quiet=True)
        params.append(trainer.params)
        trainer.shutdown()
    for name, value in params[1].items():
        np.testing.assert_array_equal(params[0][name], value, err_msg=name)
