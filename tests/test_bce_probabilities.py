"""binary_cross_entropy on values outside [0, 1]: torch 2.13 raises ("all elements of input/target
should be between 0 and 1"); graphc's loss is NaN there (it was a finite number: the clamped logs
gave 35.05 for such inputs, the target's linear term 0.857), and the Trainer refuses a batch whose
target is outside [0, 1] before the step, naming the input and the position."""

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc import nn

RNG = np.random.default_rng(0)
BACKENDS = ["numpy", "ort-cpu"]


class Loss(nn.Module):
    def forward(self, p, t):
        return {"loss": F.binary_cross_entropy(p, t, reduction="none")}


class Classifier(nn.Module):
    def __init__(self, raw: bool = False):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.raw = raw  # a model that forgot its sigmoid: "probabilities" outside [0, 1]

    def forward(self, x, t):
        z = self.fc(x)
        return {"loss": F.binary_cross_entropy(z if self.raw else gc.sigmoid(z), t)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_elements_outside_0_1_are_nan_where_torch_raises(backend):
    torch = pytest.importorskip("torch")
    p = np.array([0.3, 0.0, 1.0, 1.5, -0.2, np.nan, 0.4, 0.4, 0.4, 0.5, 1 + 1e-7, -1e-30], np.float32)
    t = np.array([0.2, 0.0, 1.0, 0.5, 0.5, 0.5, -0.1, 1.1, np.nan, 1.0, 0.5, 0.5], np.float32)
    model = gc.capture(Loss(), seed=0, p=gc.spec("float32", (12,)), t=gc.spec("float32", (12,)))
    got = gc.Session(model, backend=backend).run({"p": p, "t": t})["loss"]
    for i in range(12):
        pi, ti = torch.from_numpy(p[i:i + 1]), torch.from_numpy(t[i:i + 1])
        if 0 <= p[i] <= 1 and 0 <= t[i] <= 1:
            want = torch.nn.functional.binary_cross_entropy(pi, ti, reduction="none").numpy()
            np.testing.assert_allclose(got[i:i + 1], want, rtol=1e-6)
        else:
            assert np.isnan(got[i]), i
            with pytest.raises(RuntimeError, match="should be between 0 and 1"):
                torch.nn.functional.binary_cross_entropy(pi, ti)


def _case(raw: bool = False):
    model = gc.capture(Classifier(raw), seed=0, x=gc.spec("float32", ("N", 4)), t=gc.spec("float32", ("N", 3)))
    arts = gc.training.generate(model, "loss", gc.optim.SGD(0.1))
    return arts, RNG.standard_normal((8, 4)).astype(np.float32), RNG.random((8, 3)).astype(np.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_target_outside_0_1_is_refused_before_the_step(backend):
    torch = pytest.importorskip("torch")
    arts, x, t = _case()
    assert arts.manifest.probabilities == ["t"]
    trainer = gc.Trainer(arts, backend=backend)
    before = {name: value.copy() for name, value in trainer.params.items()}
    bad = t.copy()
    bad[5, 1] = 1.25
    with pytest.raises(RuntimeError, match="all elements of target should be between 0 and 1"):
        torch.nn.functional.binary_cross_entropy(torch.sigmoid(torch.from_numpy(x[:, :3])), torch.from_numpy(bad))
    message = r"'t' holds 1.25 at \(5, 1\); binary_cross_entropy reads it as probabilities, all between 0 and 1"
    with pytest.raises(gc.InputError, match=f"a train step: {message}"):
        trainer.step({"x": x, "t": bad})
    with pytest.raises(gc.InputError, match=f"an evaluation: {message}"):
        trainer.evaluate({"x": x, "t": bad})
    with pytest.raises(gc.InputError, match=f"the training loader: {message}"):
        trainer.fit(gc.data.DataLoader({"x": x, "t": bad}, batch_size=4), 1, progress=False, quiet=True)
    bad[5, 1] = np.nan
    with pytest.raises(gc.InputError, match=r"a train step: 't' holds nan at \(5, 1\)"):
        trainer.step({"x": x, "t": bad})
    assert trainer.step_count == 0
    for name, value in trainer.params.items():
        np.testing.assert_array_equal(value, before[name], err_msg=name)
    assert np.isfinite(trainer.step({"x": x, "t": t}))


@pytest.mark.parametrize("backend", BACKENDS)
def test_inputs_outside_0_1_make_the_loss_nan_and_fit_stop(backend):
    """Probabilities the model computes are only known in the graph: the step's loss is NaN (35.05
    before), and fit stops at the first step, as on any NaN loss."""
    arts, x, t = _case(raw=True)
    assert arts.manifest.probabilities == ["t"]
    assert np.isnan(gc.Trainer(arts, backend=backend).step({"x": x, "t": t}))
    from graphc.runtime.trainer import TrainingFailed

    with pytest.raises(TrainingFailed, match="the loss became nan at step 1"):
        gc.Trainer(arts, backend=backend).fit(gc.data.DataLoader({"x": x, "t": t}, batch_size=4), 1,
                                              progress=False, quiet=True)


def test_valid_probabilities_train_as_torch():
    """In range, the loss and one SGD step equal torch's in float64 (the check adds no gradient)."""
    torch = pytest.importorskip("torch")
    model = gc.capture(Classifier(), seed=0, x=gc.spec("float32", ("N", 4)), t=gc.spec("float32", ("N", 3)))
    arts = gc.training.generate(model, "loss", gc.optim.SGD(0.5))
    trainer = gc.Trainer(arts, backend="numpy")
    weight, bias = (trainer.params[f"fc.{n}"].astype(np.float64) for n in ("weight", "bias"))
    x, t = RNG.standard_normal((8, 4)), RNG.random((8, 3))
    t[0] = [0.0, 1.0, 0.5]
    w = torch.tensor(weight, requires_grad=True)
    b = torch.tensor(bias, requires_grad=True)
    loss = torch.nn.functional.binary_cross_entropy(torch.sigmoid(torch.from_numpy(x) @ w.T + b), torch.from_numpy(t))
    loss.backward()
    got = trainer.step({"x": x.astype(np.float32), "t": t.astype(np.float32)})
    assert got == pytest.approx(loss.item(), rel=1e-6)
    np.testing.assert_allclose(trainer.params["fc.weight"], weight - 0.5 * w.grad.numpy(), rtol=1e-5, atol=1e-6)
