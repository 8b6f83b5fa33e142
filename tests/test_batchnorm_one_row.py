"""A train-mode BatchNorm given one value per channel (a 1-row batch into BatchNorm1d): the
running variance's n/(n-1) is 1/0, and the step used to write NaN into it with a finite loss.
PyTorch raises; the Trainer refuses the batch (``step``) or the loader (``fit``), changing nothing."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc

F64 = {"dtype": "float64"}


class _Net(gc.nn.Module):
    def __init__(self, conv: bool):
        super().__init__()
        self.conv = conv
        if conv:
            self.c = gc.nn.Conv2d(2, 3, 3, padding=1, **F64)
        self.bn = (gc.nn.BatchNorm2d if conv else gc.nn.BatchNorm1d)(3, **F64)
        self.head = gc.nn.Linear(3 * 16 if conv else 3, 2, **F64)

    def forward(self, x):
        return self.head(self.bn(self.c(x) if self.conv else x).flatten(1))


def _arts(conv: bool, batchnorm: str = "train"):
    shape = ("N", 2, 4, 4) if conv else ("N", 3)
    return gc.training.generate(gc.capture(_Net(conv), x=gc.spec("float64", shape)),
                                gc.losses.mse("output", label="y"), gc.optim.SGD(0.1, momentum=0.9),
                                batchnorm=batchnorm)


def _batch(rows: int, conv: bool):
    rng = np.random.default_rng(rows)
    return {"x": rng.standard_normal((rows, 2, 4, 4) if conv else (rows, 3)), "y": rng.standard_normal((rows, 2))}


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_one_row_batch_into_batchnorm1d_is_refused_and_changes_nothing(backend):
    arts = _arts(conv=False)
    assert arts.manifest.one_row_batchnorms == {"bn": ("x", 0)}
    trainer = gc.Trainer(arts, backend=backend)
    before = trainer.state_dict()
    with pytest.raises(gc.InputError, match=r"more than 1 value per channel in BatchNorm 'bn'.*'x' has 1 row"):
        trainer.step(_batch(1, conv=False))
    assert trainer.step_count == 0
    for name, value in trainer.state_dict().items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    assert np.isfinite(trainer.step(_batch(2, conv=False)))
    assert np.isfinite(trainer.state_dict()["bn.running_var"]).all()


def test_batchnorm2d_over_maps_trains_on_one_row_as_torch_does():
    torch = pytest.importorskip("torch")
    arts = _arts(conv=True)
    assert arts.manifest.one_row_batchnorms == {}  # 16 values per channel in one image
    trainer = gc.Trainer(arts, backend="numpy")
    twin = torch.nn.ModuleDict({"c": torch.nn.Conv2d(2, 3, 3, padding=1, dtype=torch.float64),
                                "bn": torch.nn.BatchNorm2d(3, dtype=torch.float64),
                                "head": torch.nn.Linear(48, 2, dtype=torch.float64)})
    twin.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in arts.state.items() if k in twin.state_dict()},
                         strict=False)
    opt = torch.optim.SGD(twin.parameters(), lr=0.1, momentum=0.9)
    for rows in (1, 1, 3):
        batch = _batch(rows, conv=True)
        opt.zero_grad()
        out = twin["head"](twin["bn"](twin["c"](torch.from_numpy(batch["x"]))).flatten(1))
        loss = torch.nn.functional.mse_loss(out, torch.from_numpy(batch["y"]))
        loss.backward()
        opt.step()
        np.testing.assert_allclose(trainer.step(batch), loss.item(), rtol=1e-10)
    np.testing.assert_allclose(trainer.state_dict()["bn.running_var"], twin["bn"].running_var.numpy(), rtol=1e-10)


def test_fit_refuses_a_loader_with_a_last_batch_of_one_row_before_the_first_step():
    trainer = gc.Trainer(_arts(conv=False), backend="numpy")
    data = _batch(9, conv=False)
    with pytest.raises(ValueError, match=r"a batch of 1 row \(9 rows in batches of 4\).*BatchNorm 'bn'.*drop_last=True"):
        trainer.fit(gc.data.DataLoader(data, batch_size=4), 1, progress=False, quiet=True)
    assert trainer.step_count == 0
    trainer.fit(gc.data.DataLoader(data, batch_size=4, drop_last=True), 1, progress=False, quiet=True)
    assert trainer.step_count == 2 and np.isfinite(trainer.state_dict()["bn.running_var"]).all()


def test_frozen_batchnorm_trains_on_one_row():
    arts = _arts(conv=False, batchnorm="frozen")  # running statistics read, never updated
    assert arts.manifest.one_row_batchnorms == {}
    assert np.isfinite(gc.Trainer(arts, backend="numpy").step(_batch(1, conv=False)))
