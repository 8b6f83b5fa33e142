"""``gc.nn.Embedding(max_norm=...)`` and ``F.embedding(..., max_norm=...)`` against torch: the rows
looked up whose norm exceeds ``max_norm`` come out scaled to it, the scaling not differentiated (torch
renormalises them in place under ``no_grad``); on numpy and ort-cpu. Trained, the weight is stepped as torch's
optimizer steps it: from its renormalised value (the in-place change persists), each row looked up
renormalised once however often the batch repeats it, the rows never looked up untouched; with a
tied output layer, which reads the renormalised weight too."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from torch_grad_util import gc_grads

torch = pytest.importorskip("torch")

R = np.random.default_rng(0)
WEIGHT = R.normal(size=(6, 3)) * 1.5  # row norms from about 0.9 to 4: some over max_norm, some not
INDICES = np.array([[0, 2, 2, 4], [5, 1, 0, 3]])


def _layers(dtype: str, padding_idx: int | None, **norm):
    layer = gc.nn.Embedding(6, 3, padding_idx=padding_idx, dtype=dtype, **norm)
    layer.weight = gc.nn.Parameter(WEIGHT.astype(dtype), dtype=dtype)
    twin = torch.nn.Embedding(6, 3, padding_idx=padding_idx, dtype=getattr(torch, dtype), **norm)
    with torch.no_grad():
        twin.weight.copy_(torch.from_numpy(WEIGHT))
    return layer, twin


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, 3.0])
@pytest.mark.parametrize("padding_idx", [None, 4])
def test_the_lookup_and_its_gradient_match_torch(dtype, norm_type, padding_idx):
    layer, twin = _layers(dtype, padding_idx, max_norm=1.5, norm_type=norm_type)
    want = twin(torch.from_numpy(INDICES))
    c = R.standard_normal(tuple(want.shape)).astype(dtype)
    (want * torch.from_numpy(c)).sum().backward()
    assert not np.allclose(twin.weight.detach().numpy(), WEIGHT)  # torch renormed rows in place
    tol = {"rtol": 1e-12, "atol": 0} if dtype == "float64" else {"rtol": 1e-6, "atol": 1e-7}
    for backend in ("numpy", "ort-cpu"):
        got = gc_grads(lambda m, i: m(i), {}, {"i": INDICES}, c, module=layer, backend=backend)
        np.testing.assert_allclose(got["out"], want.detach().numpy(), **tol, err_msg=backend)
        np.testing.assert_allclose(got["m.weight"], twin.weight.grad.numpy(), **tol, err_msg=backend)
    norms = np.linalg.norm(got["out"], ord=norm_type, axis=-1)
    assert norms.max() <= 1.5 * (1 + 1e-6) and (np.linalg.norm(WEIGHT, ord=norm_type, axis=-1) > 1.5).any()


def test_the_functional_form_matches_torch():
    c = R.standard_normal((2, 4, 3))
    w = torch.tensor(WEIGHT, requires_grad=True)
    want = torch.nn.functional.embedding(torch.from_numpy(INDICES), w, max_norm=2.0)
    (want * torch.from_numpy(c)).sum().backward()
    got = gc_grads(lambda F, w, i: F.embedding(i, w, max_norm=2.0), {"w": WEIGHT}, {"i": INDICES}, c,
                   backend="ort-cpu")
    np.testing.assert_allclose(got["out"], want.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(got["w"], w.grad.numpy(), rtol=1e-12)


ROWS, DIM = 8, 3  # indices drawn from 0..5: rows 6 and 7 (norms over max_norm) are never looked up
START = R.normal(size=(ROWS, DIM)) * 1.5
OPTIMIZERS = {"sgd": (lambda: gc.optim.SGD(lr=0.1, momentum=0.9), lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9)),
              "adam": (lambda: gc.optim.Adam(lr=0.05), lambda ps: torch.optim.Adam(ps, lr=0.05)),
              "adamw": (lambda: gc.optim.AdamW(lr=0.05, weight_decay=0.1),
                        lambda ps: torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1))}


def _forward(m, i):
    return m.fc(m.emb(i).mean(1))


class _Net(gc.nn.Module):
    """Embedding(max_norm) -> mean over the sequence -> Linear; ``tied``: the Linear's weight is the
    embedding's ([ROWS, DIM]: logits over the rows)."""

    def __init__(self, norm_type: float = 2.0, tied: bool = False, dtype: str = "float64",
                 padding_idx: int | None = None):
        super().__init__()
        self.emb = gc.nn.Embedding(ROWS, DIM, max_norm=1.0, norm_type=norm_type, dtype=dtype, padding_idx=padding_idx)
        self.emb.weight = gc.nn.Parameter(START.astype(dtype), dtype=dtype)
        self.fc = gc.nn.Linear(DIM, ROWS if tied else 2, dtype=dtype)
        if tied:
            self.fc.weight = self.emb.weight

    forward = _forward


class _Twin(torch.nn.Module):
    def __init__(self, net: _Net, norm_type: float, tied: bool):
        super().__init__()
        dtype = getattr(torch, str(net.emb.weight.numpy().dtype))
        self.emb = torch.nn.Embedding(ROWS, DIM, max_norm=1.0, norm_type=norm_type, dtype=dtype,
                                      padding_idx=net.emb.padding_idx)
        self.fc = torch.nn.Linear(DIM, ROWS if tied else 2, dtype=dtype)
        if tied:
            self.fc.weight = self.emb.weight
        self.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in net.state_dict().items()})

    forward = _forward


def _batches(outputs: int, steps: int = 10, dtype: str = "float64") -> list[dict]:
    rng = np.random.default_rng(1)
    out = []
    for _ in range(steps):
        i = rng.integers(0, 6, (3, 4))
        i[0, :3] = i[1, 0]  # a row repeated in the batch: torch renormalises it once
        out.append({"i": i, "y": rng.normal(size=(3, outputs)).astype(dtype)})
    return out


def _torch_steps(twin, make_opt, batches) -> list[float]:
    opt, losses = make_opt(twin.parameters()), []
    for b in batches:
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(twin(torch.from_numpy(b["i"])), torch.from_numpy(b["y"]))
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def _artifacts(net, kind, training: bool = True):
    model = gc.capture(net, training=training, i=gc.spec("int64", ("N", 4)))
    return gc.training.generate(model, gc.losses.mse("output", label="y"), OPTIMIZERS[kind][0]())


def _assert_weights(trainer, twin, rtol: float = 1e-12, atol: float = 1e-15):
    got, want = trainer.state_dict(), twin.state_dict()
    assert "emb.weight" in got
    for name in set(got) & set(want):  # a tied weight once, under its first name
        np.testing.assert_allclose(got[name], want[name].numpy(), rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("kind", list(OPTIMIZERS))
@pytest.mark.parametrize("norm_type", [2.0, 1.0])
def test_training_steps_the_renormalised_weight_as_torch_and_resumes_exactly(tmp_path, backend, kind, norm_type):
    net = _Net(norm_type)
    arts = _artifacts(net, kind)
    assert arts.manifest.renormed == ["emb.weight"]
    twin, batches = _Twin(net, norm_type, False), _batches(2)
    trainer = gc.Trainer(arts, backend=backend)
    losses = []
    for k, b in enumerate(batches):
        losses.append(trainer.step(b))
        if k == 4:
            trainer.save_checkpoint(tmp_path / "ck")
    np.testing.assert_allclose(losses, _torch_steps(twin, OPTIMIZERS[kind][1], batches), rtol=1e-12, atol=1e-15)
    _assert_weights(trainer, twin)
    weight = trainer.state_dict()["emb.weight"]
    assert (np.linalg.norm(START[:6], ord=norm_type, axis=1) > 1).any()
    if kind != "adamw":  # no weight decay: the rows never looked up are never changed (adamw decays them)
        np.testing.assert_array_equal(weight[6:], START[6:])

    fresh = gc.Trainer(arts, backend=backend)
    fresh.load_checkpoint(tmp_path / "ck")
    assert [fresh.step(b) for b in batches[5:]] == losses[5:]
    for name, value in trainer.state_dict().items():
        np.testing.assert_array_equal(fresh.state_dict()[name], value, err_msg=name)

    # eval and the inference graph renormalise the rows they look up, as torch's eval mode does
    held = {"i": np.array([[6, 7, 7, 0], [1, 6, 2, 2]]), "y": np.ones((2, 2))}
    twin.eval()
    with torch.no_grad():
        out = twin(torch.from_numpy(held["i"]))
    want = torch.nn.functional.mse_loss(out, torch.from_numpy(held["y"])).item()
    np.testing.assert_allclose(trainer.evaluate(held)["loss"], want, rtol=1e-12)
    np.testing.assert_array_equal(trainer.state_dict()["emb.weight"], weight)  # evaluate does not write it
    trainer.export_inference(tmp_path / "inf.onnx")
    onnx = pytest.importorskip("onnx")
    onnx.checker.check_model(str(tmp_path / "inf.onnx"), full_check=True)
    got = gc.Session(tmp_path / "inf.onnx", backend=backend).run({"i": held["i"]})["output"]
    np.testing.assert_allclose(got, out.numpy(), rtol=1e-12)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_a_tied_output_layer_reads_the_renormalised_weight_as_torch(backend):
    net = _Net(tied=True)
    arts = _artifacts(net, "adamw")
    assert arts.manifest.trainable == ["emb.weight", "fc.bias"] and arts.manifest.renormed == ["emb.weight"]
    twin, batches = _Twin(net, 2.0, True), _batches(ROWS)
    trainer = gc.Trainer(arts, backend=backend)
    losses = [trainer.step(b) for b in batches]
    np.testing.assert_allclose(losses, _torch_steps(twin, OPTIMIZERS["adamw"][1], batches), rtol=1e-12, atol=1e-15)
    _assert_weights(trainer, twin)


def test_a_captured_forward_sees_the_renormalised_weight_after_the_lookup():
    """Inference capture: a second read of the weight (tied) after the lookup reads the renormed rows."""
    net = _Net(tied=True)
    twin = _Twin(net, 2.0, True).eval()
    i = np.array([[0, 1, 1, 3]])
    with torch.no_grad():
        want = twin(torch.from_numpy(i)).numpy()
    model = gc.capture(net, i=gc.spec("int64", ("N", 4)))
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_allclose(gc.Session(model, backend=backend).run({"i": i})["output"], want, rtol=1e-12)


def test_data_parallel_training_refuses_lookups_whose_rows_depend_on_a_param():
    """The workers agree on the rows each lookup renormalises before the forward (from their shards'
    data); a second lookup of the rows the first one's tied logits pick cannot be known then.
    (Data-parallel training as torch: ``test_distributed.py``.)"""
    from graphc.errors import ArtifactsError

    class Picking(_Net):
        def forward(self, i):
            picked = self.fc(self.emb(i)).argmax(-1)
            return self.fc(self.emb(picked).mean(1))

    model = gc.capture(Picking(tied=True), i=gc.spec("int64", ("N", 4)))
    arts = gc.training.generate(model, gc.losses.mse("output", label="y"), OPTIMIZERS["sgd"][0]())
    with pytest.raises(ArtifactsError, match=r"the rows an embedding with max_norm renormalises depend on "
                                             r"\['emb.weight', 'fc.bias'\], not only on the batch.*train with one worker"):
        gc.Trainer(arts, workers=2)


def _ops(model) -> list[str]:
    return [n.op_type for n in model.ir.graph]


def test_a_capture_drops_the_write_back_nothing_reads():
    """An inference lookup keeps no ScatterND of the table (it copied all of it each run) unless a later
    read sees the renormalised weight (tied); a training-mode capture neither: train_step writes it back."""
    emb = gc.nn.Embedding(50, 4, max_norm=1.0)
    for training in (False, True):
        ops = _ops(gc.capture(emb, training=training, i=gc.spec("int64", ("N", 3))))
        assert "ScatterND" not in ops and len(ops) == 26, ops  # 5 of them refuse a negative index
    assert _ops(gc.capture(_Net(tied=True), i=gc.spec("int64", ("N", 4)))).count("ScatterND") == 1
    arts = _artifacts(_Net(), "sgd", training=False)
    assert arts.manifest.renormed == ["emb.weight"]
    assert [n.op_type for n in arts.train_step.graph].count("ScatterND") == 1
    assert "ScatterND" not in [n.op_type for n in arts.inference.graph]


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("tied", [False, True])
def test_an_eval_mode_capture_trains_as_torch(backend, tied):
    """The README's flow (gc.capture in eval mode, then generate): the write-back capture dropped is
    written back again in train_step."""
    net = _Net(tied=tied)
    arts = _artifacts(net, "adamw", training=False)
    twin, batches = _Twin(net, 2.0, tied), _batches(ROWS if tied else 2)
    trainer = gc.Trainer(arts, backend=backend)
    losses = [trainer.step(b) for b in batches]
    np.testing.assert_allclose(losses, _torch_steps(twin, OPTIMIZERS["adamw"][1], batches), rtol=1e-12, atol=1e-15)
    _assert_weights(trainer, twin)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_padding_idx_with_max_norm_trains_as_torch(backend, kind):
    """The padding row gets no gradient but is renormalised when looked up (torch's embedding_renorm_
    does not skip it), and AdamW decays it."""
    net = _Net(padding_idx=2)
    twin, batches = _Twin(net, 2.0, False), _batches(2)
    assert any((b["i"] == 2).any() for b in batches) and np.linalg.norm(START[2]) > 1
    trainer = gc.Trainer(_artifacts(net, kind), backend=backend)
    losses = [trainer.step(b) for b in batches]
    np.testing.assert_allclose(losses, _torch_steps(twin, OPTIMIZERS[kind][1], batches), rtol=1e-12, atol=1e-15)
    _assert_weights(trainer, twin)


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("tied", [False, True])
def test_float32_training_matches_torch(backend, tied):
    net = _Net(tied=tied, dtype="float32")
    twin, batches = _Twin(net, 2.0, tied), _batches(ROWS if tied else 2, dtype="float32")
    trainer = gc.Trainer(_artifacts(net, "adam"), backend=backend)
    losses = [trainer.step(b) for b in batches]
    assert trainer.state_dict()["emb.weight"].dtype == np.float32
    np.testing.assert_allclose(losses, _torch_steps(twin, OPTIMIZERS["adam"][1], batches), rtol=1e-6)  # 1.7e-7
    _assert_weights(trainer, twin, rtol=1e-6, atol=5e-7)  # 1.1e-7


def test_a_dropped_write_back_whose_values_are_gone_is_refused():
    """The record names the values the lookup read; a model edited after capture may not have them."""
    from graphc.errors import PassError

    model = gc.capture(_Net(), i=gc.spec("int64", ("N", 4)))
    model.ir.graph.inputs[0].name = "ids"
    with pytest.raises(PassError, match=r"the embedding of 'emb.weight' with max_norm at .*: the value 'i' it looked "
                                        r"up is no longer in the model"):
        gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(lr=0.1))
