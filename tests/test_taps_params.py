"""Conv weights that train_step holds as [Co, kh, kw, Ci], the order a small-map conv's
matrix product reads them (``passes/training/taps_params.py``, the manifest's ``orders``).

Oracles: the same artifacts with every param in the model's order (equal bit for bit: only
where the values sit changes), ``torch.optim`` on the same net when torch is installed, and
checkpoints that cross the layout."""

from __future__ import annotations

import json
from fnmatch import fnmatchcase

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh
import pytest

import graphc as gc
from graphc.passes.training import taps_params

C = 8
SPECS = {"sgd-nesterov": gc.optim.SGD(0.05, momentum=0.9, nesterov=True, weight_decay=0.1),
         "adam": gc.optim.Adam(0.02, weight_decay=0.05, no_decay=("*.bias",)),
         "adamw": gc.optim.AdamW(0.02, weight_decay=0.2, no_decay=("head.*",))}
HELD = {"c1.weight": [0, 2, 3, 1], "c2.weight": [0, 2, 3, 1]}


def weights(dtype=np.float32) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    shapes = {"c1.weight": (0.3, (C, 3, 3, 3)), "c1.bias": (0.1, C), "c2.weight": (0.2, (C, C, 3, 3)),
              "head.weight": (0.3, (C, C, 1, 1)), "head.bias": (0.1, C)}
    return {name: rng.normal(0, scale, shape).astype(dtype) for name, (scale, shape) in shapes.items()}


def model(dtype=np.float32) -> gc.Model:
    """x [N, 3, 4, 4] -> Conv 3x3 pad 1 (bias) -> Relu -> Conv 3x3 pad 1 -> Relu -> Conv 1x1 (bias):
    the 3x3 convs run as products reading x's pixels (a symbolic batch counts as 16)."""
    nodes = [oh.make_node("Conv", ["x", "c1.weight", "c1.bias"], ["h1"], pads=[1, 1, 1, 1]),
             oh.make_node("Relu", ["h1"], ["r1"]),
             oh.make_node("Conv", ["r1", "c2.weight"], ["h2"], pads=[1, 1, 1, 1]),
             oh.make_node("Relu", ["h2"], ["r2"]),
             oh.make_node("Conv", ["r2", "head.weight", "head.bias"], ["out"])]
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = oh.make_graph(nodes, "held", [oh.make_tensor_value_info("x", elem, ["N", 3, 4, 4])],
                          [oh.make_tensor_value_info("out", elem, ["N", C, 4, 4])],
                          [nh.from_array(a, n) for n, a in weights(dtype).items()])
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    onnx.checker.check_model(proto, full_check=True)
    return gc.load(proto)


def generate(spec, held=True, dtype=np.float32, monkeypatch=None, **kw):
    if not held:
        monkeypatch.setattr(taps_params, "chains", lambda graph, params: {})
    try:
        return gc.training.generate(model(dtype), gc.losses.mse("out", label="y"), spec, **kw)
    finally:
        if not held:
            monkeypatch.undo()


def batches(n=4, size=16, dtype=np.float32):
    rng = np.random.default_rng(1)
    return [{"x": rng.normal(size=(size, 3, 4, 4)).astype(dtype), "y": rng.normal(size=(size, C, 4, 4)).astype(dtype)}
            for _ in range(n)]


def test_only_the_taps_products_weights_are_held_and_only_in_train_step(monkeypatch):
    arts = generate(SPECS["adamw"])
    assert arts.manifest.orders == HELD
    inputs = {e.name: e.shape for e in arts.manifest.graphs["train_step"].inputs}
    assert inputs["c1.weight"] == [C, 3, 3, 3] and inputs["c2.weight"] == [C, 3, 3, C]
    for key in ("gradients", "eval"):
        assert {e.name: e.shape for e in arts.manifest.graphs[key].inputs}["c2.weight"] == [C, C, 3, 3]
    assert arts.manifest.carried()["c2.weight.exp_sum"].shape == [C, C, 3, 3]
    assert arts.state["c2.weight"].shape == (C, C, 3, 3)
    model_order = generate(SPECS["adamw"], held=False, monkeypatch=monkeypatch)
    assert model_order.manifest.orders == {}
    assert arts.manifest.interface() == model_order.manifest.interface()  # checkpoints fit both

    def count(a, op):
        return sum(n.op_type == op for n in a.train_step.proto.graph.node)
    # each held weight's Transpose and Gather gone, and its gradient's
    assert count(model_order, "Gather") - count(arts, "Gather") == 4
    assert count(model_order, "Transpose") - count(arts, "Transpose") == 4


@pytest.mark.parametrize("fused", [True, False])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("spec", list(SPECS))
def test_held_weights_train_as_the_models_order_bit_for_bit(spec, backend, fused, monkeypatch):
    held = gc.Trainer(generate(SPECS[spec], fused=fused), backend=backend)
    plain = gc.Trainer(generate(SPECS[spec], held=False, monkeypatch=monkeypatch, fused=fused), backend=backend)
    assert held.manifest.orders == HELD and not plain.manifest.orders
    for batch in batches():
        assert held.step(batch) == plain.step(batch)
        assert held.evaluate(batch) == plain.evaluate(batch)  # eval reads the held weights in the model's order
    got, want = held.state_dict(), plain.state_dict()
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].shape == want[name].shape and np.array_equal(got[name], want[name]), name
    out = held.predict({"x": batches()[0]["x"]})["out"]
    np.testing.assert_array_equal(out, plain.predict({"x": batches()[0]["x"]})["out"])


@pytest.mark.parametrize("spec", list(SPECS))
def test_held_weights_step_as_torch_optim(spec):
    torch = pytest.importorskip("torch")
    arts = generate(SPECS[spec], dtype=np.float64)
    assert arts.manifest.orders == HELD
    trainer = gc.Trainer(arts, backend="numpy")
    w = {n: torch.tensor(a, requires_grad=True) for n, a in weights(np.float64).items()}
    s = SPECS[spec]
    decayed = [n for n in w if not any(fnmatchcase(n, p) for p in s.no_decay or ())]
    groups = [{"params": [w[n] for n in decayed]}, {"params": [w[n] for n in w if n not in decayed], "weight_decay": 0.0}]
    if spec == "sgd-nesterov":
        opt = torch.optim.SGD(groups, lr=s.lr, momentum=0.9, nesterov=True, weight_decay=s.weight_decay)
    else:
        opt = (torch.optim.Adam if spec == "adam" else torch.optim.AdamW)(groups, lr=s.lr, weight_decay=s.weight_decay,
                                                                          foreach=False)
    F = torch.nn.functional
    for batch in batches(dtype=np.float64):
        x, y = torch.tensor(batch["x"]), torch.tensor(batch["y"])
        h = F.relu(F.conv2d(F.relu(F.conv2d(x, w["c1.weight"], w["c1.bias"], padding=1)), w["c2.weight"], padding=1))
        loss = F.mse_loss(F.conv2d(h, w["head.weight"], w["head.bias"]), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        np.testing.assert_allclose(trainer.step(batch), loss.item(), rtol=1e-8)
    params = trainer.params
    for name, value in w.items():
        np.testing.assert_allclose(params[name], value.detach().numpy(), rtol=1e-7, atol=1e-8, err_msg=name)


@pytest.mark.parametrize("first_held", [True, False])
def test_checkpoints_resume_across_the_layout(first_held, tmp_path, monkeypatch):
    """A checkpoint names tensors per param in the model's order: one saved by a held layout
    resumes in artifacts of the model's order, and the other way round, as one run."""
    spec = SPECS["adamw"]
    first = gc.Trainer(generate(spec, held=first_held, monkeypatch=monkeypatch), backend="ort-cpu")
    second = gc.Trainer(generate(spec, held=not first_held, monkeypatch=monkeypatch), backend="ort-cpu")
    whole = gc.Trainer(generate(spec), backend="ort-cpu")
    data = batches(6)
    for batch in data[:3]:
        first.step(batch)
        whole.step(batch)
    first.save_checkpoint(tmp_path / "ckpt.safetensors")
    second.load_checkpoint(tmp_path / "ckpt.safetensors")
    assert [second.step(b) for b in data[3:]] == [whole.step(b) for b in data[3:]]
    got, want = second.state_dict(), whole.state_dict()
    assert all(np.array_equal(got[n], want[n]) for n in want)


def test_recomputation_copies_the_chain_and_still_holds_the_weights(monkeypatch):
    held = gc.Trainer(generate(SPECS["adam"], recompute=True), backend="ort-cpu")
    plain = gc.Trainer(generate(SPECS["adam"], held=False, monkeypatch=monkeypatch, recompute=True), backend="ort-cpu")
    assert held.manifest.orders == HELD
    assert [held.step(b) for b in batches()] == [plain.step(b) for b in batches()]


def test_saved_artifacts_keep_the_orders_and_refuse_a_wrong_one(tmp_path):
    arts = generate(SPECS["sgd-nesterov"])
    arts.save(tmp_path / "arts")
    loaded = gc.training.load(tmp_path / "arts")
    assert loaded.manifest.orders == HELD
    packed = loaded.manifest.pack(loaded.state)
    assert packed["c2.weight"].shape == (C, 3, 3, C)
    np.testing.assert_array_equal(packed["c2.weight"], loaded.state["c2.weight"].transpose(0, 2, 3, 1))
    back = loaded.manifest.unpack(packed)
    assert all(np.array_equal(back[n], loaded.state[n]) for n in loaded.state)
    assert loaded.manifest.pack(loaded.state, "eval")["c2.weight"].shape == (C, C, 3, 3)  # eval: the model's order
    path = tmp_path / "arts" / "manifest.json"
    edited = json.loads(path.read_text())
    edited["orders"]["c2.weight"] = [0, 2, 3]
    path.write_text(json.dumps(edited))
    with pytest.raises(gc.errors.ArtifactsError, match="orders holds 'c2.weight' in the order"):
        gc.training.load(tmp_path / "arts")


def test_format_4_artifacts_train_as_they_were_saved(tmp_path, monkeypatch):
    """Artifacts saved before ``orders`` (format 4: every param in the model's order) load,
    train and resume."""
    generate(SPECS["adamw"], held=False, monkeypatch=monkeypatch).save(tmp_path / "arts")
    path = tmp_path / "arts" / "manifest.json"
    edited = json.loads(path.read_text())
    del edited["orders"]
    edited["format"] = "graphc.training/4"
    path.write_text(json.dumps(edited))
    old = gc.Trainer(tmp_path / "arts", backend="ort-cpu")
    new = gc.Trainer(generate(SPECS["adamw"]), backend="ort-cpu")
    assert old.manifest.format == "graphc.training/4" and not old.manifest.orders
    assert [old.step(b) for b in batches()] == [new.step(b) for b in batches()]
