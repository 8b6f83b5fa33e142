"""``gc.optimize`` at level 3 marks the model inference-only (``INFERENCE_ONLY_KEY``, naming the parameters it
folded, merged or dropped): gc.grad, gc.training.generate and ``graphc grad`` refuse it, also after save and
load; the model still runs and saves; levels 0-2 differentiate as torch 2.13 (float64)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import graphc as gc
from cli_util import one_line_error, run_cli
from graphc.passes.values import INFERENCE_ONLY_KEY

torch = pytest.importorskip("torch")

X = np.random.default_rng(0).normal(size=(5, 3))


class Twin(gc.nn.Module):
    """Two equal parameters: level 3 merges ``b`` into ``a`` (the duplicate-initializer merge)."""

    def __init__(self):
        super().__init__()
        self.a = gc.nn.Parameter(np.full(3, 2.0))
        self.b = gc.nn.Parameter(np.full(3, 2.0))

    def forward(self, x):
        return {"loss": ((x * self.a) ** 2).sum() + (x * self.b).sum()}


def _torch_grads(x):
    p = {k: torch.full((3,), 2.0, dtype=torch.float64, requires_grad=True) for k in "ab"}
    tx = torch.tensor(x)
    loss = ((tx * p["a"]) ** 2).sum() + (tx * p["b"]).sum()
    loss.backward()
    return loss.item(), {k: v.grad.numpy() for k, v in p.items()}


def test_level_3_refuses_gradients_naming_the_folded_parameters(tmp_path):
    """Before the mark, gc.grad of the level-3 model returned a_grad 2.06 off torch's (b's gradient added in)
    and no b_grad, with no error; now gc.grad and generate refuse, naming the model, b and level 2."""
    model = gc.capture(Twin().double(), x=gc.spec("float64", ("N", 3)))
    optimized = gc.optimize(model, level=3)
    assert json.loads(optimized.ir.metadata_props[INFERENCE_ONLY_KEY]) == {"folded_parameters": ["b"]}
    message = (r"model 'Twin' cannot be differentiated: gc.optimize at level 3 \(inference only\) folded, merged "
               r"or dropped parameter 'b' \(their gradients would be wrong or missing\); differentiate or train "
               r"the captured model, or one from gc.optimize\(model, level=2\)")
    with pytest.raises(gc.GraphError, match=message):
        gc.grad(optimized, "loss")
    onnx.save(optimized.proto, tmp_path / "o3.onnx")
    with pytest.raises(gc.GraphError, match=message):  # the mark survives save and load
        gc.training.generate(gc.load(tmp_path / "o3.onnx"), "loss", gc.optim.SGD(0.1))
    with pytest.raises(gc.GraphError, match=message):  # a second level-3 run keeps the first one's names
        gc.grad(gc.optimize(optimized, level=3), "loss")
    want_loss, want = _torch_grads(X)
    for level in (0, 1, 2):
        got = gc.Session(gc.grad(gc.optimize(model, level=level), "loss"), backend="numpy").run({"x": X})
        for name, w in want.items():
            np.testing.assert_allclose(got[f"{name}_grad"], w, rtol=1e-12, err_msg=f"{level} {name}")
    for backend in ("numpy", "ort-cpu"):  # inference still runs, from the saved file too
        got = gc.Session(gc.load(tmp_path / "o3.onnx"), backend=backend).run({"x": X})["loss"]
        np.testing.assert_allclose(got, want_loss, rtol=1e-12, err_msg=backend)


def test_level_3_model_without_folds_is_still_refused():
    """Dropout removal and the other level-3 rewrites change training too: the mark is set whatever was folded."""
    model = gc.capture(lambda x: {"loss": (x * x).sum()}, x=gc.spec("float64", (2, 3)))
    optimized = gc.optimize(model, level=3)
    with pytest.raises(gc.GraphError, match=r"level 3 \(inference only\) rewrote it for inference; differentiate"):
        gc.grad(optimized, "loss", wrt=["x"])
    for level in (0, 1, 2):
        assert INFERENCE_ONLY_KEY not in gc.optimize(model, level=level).ir.metadata_props


def test_cli_grad_refuses_a_level_3_model(tmp_path, capsys):
    onnx.save(gc.capture(Twin().double(), x=gc.spec("float64", ("N", 3))).proto, tmp_path / "twin.onnx")
    assert run_cli(capsys, "optimize", tmp_path / "twin.onnx", "--level", "3", "-o", tmp_path / "o3.onnx").code == 0
    err = one_line_error(run_cli(capsys, "grad", tmp_path / "o3.onnx", "--loss", "mse:loss", "-o", tmp_path / "arts"))
    assert "level 3 (inference only) folded, merged or dropped parameter 'b'" in err, err
