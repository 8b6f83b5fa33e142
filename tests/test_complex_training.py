"""Complex graph I/O (``graphc.model.complex_io``) in training and serving: the ``Trainer``'s ``step``/``fit``/
``evaluate``/``predict`` and ``graphc train``'s data take numpy complex arrays for a complex input and ``predict``
gives a complex output complex, against torch 2.13's loop on complex tensors (float64/complex128, 1e-12) and against
the same steps fed the ``[..., 2]`` pairs; the KServe v2 server takes and gives the pairs, over HTTP, and its model
metadata names them, as a Triton config.pbtxt's parameters do; ``gc.losses.l1`` on a complex output trains on complex
labels as torch's ``l1_loss``, and the losses torch refuses complex Tensors in are refused."""

from __future__ import annotations

import importlib.util

import httpx
import numpy as np
import pytest
from cli_util import run_cli
from ray_util import ray_cluster  # noqa: F401 - the module's fixture
from serve_util import running_server

import graphc as gc
from graphc.serving.kserve import model_config
from graphc.serving.serve import create_app

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ["numpy", "ort-cpu"]
LR, STEPS = 0.005, 3


def _complex(*shape, dtype=np.complex128):
    return (RNG.standard_normal(shape) + 1j * RNG.standard_normal(shape)).astype(dtype)


class _ComplexLinear(gc.nn.Module):
    """A complex linear layer from two real weights: its complex output and the power a real loss reads."""

    def __init__(self, wr, wi):
        super().__init__()
        self.wr, self.wi = gc.nn.Parameter(wr, dtype=gc.float64), gc.nn.Parameter(wi, dtype=gc.float64)

    def forward(self, z):
        y = z @ gc.complex(self.wr, self.wi)
        return {"y": y, "power": (y * y.conj()).real}


def _torch_loop(wr, wi, batches):
    """torch's SGD on complex tensors: the losses, the trained weights and the complex output after."""
    tr, ti = (torch.tensor(w, requires_grad=True) for w in (wr, wi))
    opt, losses = torch.optim.SGD([tr, ti], lr=LR), []
    for z, t in batches:
        y = torch.from_numpy(z) @ torch.complex(tr, ti)
        loss = torch.nn.functional.mse_loss((y * y.conj()).real, torch.from_numpy(t))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    with torch.no_grad():
        w = torch.complex(tr, ti)
    return losses, tr.detach().numpy(), ti.detach().numpy(), lambda z: (torch.from_numpy(z) @ w).numpy()


def _trainer(wr, wi, backend):
    model = gc.capture(_ComplexLinear(wr, wi), z=gc.spec("complex128", ("N", 4)))
    arts = gc.training.generate(model, gc.losses.mse("power", label="t"), gc.optim.SGD(LR))
    return gc.Trainer(arts, backend=backend)


def _pair(z):
    return np.stack([z.real, z.imag], -1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_trainer_steps_on_complex_arrays_as_torch_and_as_on_the_pairs(backend):
    """The Trainer refused a complex array for a complex input ('dtype complex128 is not float64') and its predict
    gave the [..., 2] pair of a complex output."""
    wr, wi = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    batches = [(_complex(5, 4), RNG.standard_normal((5, 3))) for _ in range(STEPS)]
    losses, want_r, want_i, forward = _torch_loop(wr, wi, batches)
    on_complex, on_pairs = _trainer(wr, wi, backend), _trainer(wr, wi, backend)
    assert on_complex.complex_inputs == {"z"} and on_complex.complex_outputs == {"y"}
    for (z, t), loss in zip(batches, losses):
        got = on_complex.step({"z": z, "t": t})
        assert got == on_pairs.step({"z": _pair(z), "t": t})
        assert got == pytest.approx(loss, rel=1e-12)
    for trainer in (on_complex, on_pairs):
        np.testing.assert_allclose(trainer.params["wr"], want_r, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(trainer.params["wi"], want_i, rtol=1e-12, atol=1e-14)
    z, t = _complex(6, 4), RNG.standard_normal((6, 3))
    for batch in ({"z": z}, {"z": z, "t": t}, {"z": _pair(z)}):
        y = on_complex.predict(batch)["y"]
        assert y.dtype == np.complex128 and y.shape == (6, 3)
        np.testing.assert_allclose(y, forward(z), rtol=1e-12, atol=1e-12)
    power = np.abs(forward(z)) ** 2
    assert on_complex.evaluate({"z": z, "t": t})["loss"] == pytest.approx(np.mean((power - t) ** 2), rel=1e-12)


def test_fit_reads_complex_arrays_from_a_data_loader():
    wr, wi = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    z, t = _complex(8, 4), RNG.standard_normal((8, 3))
    _, want_r, want_i, _ = _torch_loop(wr, wi, [(z[:4], t[:4]), (z[4:], t[4:])])
    trainer = _trainer(wr, wi, "ort-cpu")
    trainer.fit(gc.data.DataLoader({"z": z, "t": t}, batch_size=4, shuffle=False), epochs=1, progress=False,
                quiet=True, eval_loader=gc.data.DataLoader({"z": z, "t": t}, batch_size=4, shuffle=False))
    np.testing.assert_allclose(trainer.params["wr"], want_r, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(trainer.params["wi"], want_i, rtol=1e-12, atol=1e-14)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")
def test_data_parallel_workers_take_and_give_complex_arrays(ray_cluster):  # noqa: F811 - the fixture
    wr, wi = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    batches = [(_complex(6, 4), RNG.standard_normal((6, 3))) for _ in range(2)]
    losses, want_r, _, forward = _torch_loop(wr, wi, batches)
    trainer = gc.Trainer(_trainer(wr, wi, "numpy").artifacts, backend="numpy", workers=2, num_cpus=0.5, timeout_s=120)
    try:
        for (z, t), loss in zip(batches, losses):
            assert trainer.step({"z": z, "t": t}) == pytest.approx(loss, rel=1e-12)
        np.testing.assert_allclose(trainer.params["wr"], want_r, rtol=1e-12, atol=1e-14)
        y = trainer.predict({"z": batches[0][0]})["y"]
        assert y.dtype == np.complex128
        np.testing.assert_allclose(y, forward(batches[0][0]), rtol=1e-12, atol=1e-12)
    finally:
        trainer.shutdown()


@pytest.mark.parametrize("batch,match", [
    (lambda z, t: {"z": z.real, "t": t}, r"input 'z': expected z: complex128\[N,4\] .*got the real float64\[5,4\]"),
    (lambda z, t: {"z": z.astype(np.complex64), "t": t}, r"got complex64\[5,4\] \(cast it with .astype\(np.complex128"),
    (lambda z, t: {"z": z, "t": t + 0j}, r"input 't': .*got complex128\[5,3\] .*'t' is no complex input"),
])
def test_a_wrong_dtype_for_the_trainer_is_an_input_error_naming_the_input(batch, match):
    trainer = _trainer(RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3)), "numpy")
    with pytest.raises(gc.InputError, match=match):
        trainer.step(batch(_complex(5, 4), RNG.standard_normal((5, 3))))


def test_graphc_train_reads_complex_arrays(capsys, tmp_path):
    wr, wi = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    z, t = _complex(8, 4), RNG.standard_normal((8, 3))
    _trainer(wr, wi, "numpy").artifacts.save(tmp_path / "arts")
    np.savez(tmp_path / "data.npz", z=z, t=t)
    result = run_cli(capsys, "train", tmp_path / "arts", "--data", tmp_path / "data.npz", "--epochs", "1",
                     "--batch-size", "4", "-b", "numpy", "--checkpoint", tmp_path / "ckpt")
    assert result.code == 0, result.err
    in_process = gc.Trainer(tmp_path / "arts", backend="numpy")  # fit's loop is torch's: the test above
    in_process.fit(gc.data.DataLoader({"z": z, "t": t}, batch_size=4, seed=0), epochs=1, progress=False, quiet=True)
    trained = gc.Trainer(tmp_path / "ckpt", backend="numpy").params
    for name, value in in_process.params.items():
        np.testing.assert_array_equal(trained[name], value)
    assert not np.array_equal(trained["wr"], wr)
    np.savez(tmp_path / "bad.npz", z=z.astype(np.complex64), t=t)
    result = run_cli(capsys, "train", tmp_path / "arts", "--data", tmp_path / "bad.npz", "--epochs", "1",
                     "--batch-size", "4", "-b", "numpy")
    assert result.code != 0 and "--data" in result.err and "complex64[8,4]" in result.err


def test_kserve_takes_and_gives_complex_values_as_pairs_its_metadata_names(tmp_path):
    """The metadata route listed a complex input or output as a plain FP64 [..., 2] tensor."""
    w = _complex(4, 3)
    path = gc.capture(lambda z, x: {"y": z @ gc.complex(gc.tensor(w.real), gc.tensor(w.imag)), "n": x * 2},
                      z=gc.spec("complex128", ("N", 4)), x=gc.spec(gc.float64, ("N", 2))).save(tmp_path / "cx.onnx")
    z, x = _complex(2, 4), RNG.standard_normal((2, 2))
    body = {"inputs": [{"name": "z", "datatype": "FP64", "shape": [2, 4, 2], "data": _pair(z).ravel().tolist()},
                       {"name": "x", "datatype": "FP64", "shape": [2, 2], "data": x.ravel().tolist()}]}
    with running_server(create_app(path, backend="ort-cpu")) as address:
        meta = httpx.get(f"http://{address}/v2/models/cx", timeout=60).json()
        reply = httpx.post(f"http://{address}/v2/models/cx/infer", json=body, timeout=60)
        body["inputs"][0].update(shape=[2, 4], data=z.real.ravel().tolist())
        wrong = httpx.post(f"http://{address}/v2/models/cx/infer", json=body, timeout=60)
    assert meta["inputs"] == [{"name": "z", "datatype": "FP64", "shape": [-1, 4, 2],
                               "parameters": {"complex": "complex128"}}, {"name": "x", "datatype": "FP64", "shape": [-1, 2]}]
    assert meta["outputs"][0] == {"name": "y", "datatype": "FP64", "shape": [-1, 3, 2],
                                  "parameters": {"complex": "complex128"}}
    assert reply.status_code == 200, reply.text
    out = {o["name"]: np.asarray(o["data"]).reshape(o["shape"]) for o in reply.json()["outputs"]}
    y = out["y"][..., 0] + 1j * out["y"][..., 1]
    np.testing.assert_allclose(y, (torch.from_numpy(z) @ torch.from_numpy(w)).numpy(), rtol=1e-12, atol=1e-12)
    assert wrong.status_code == 400 and "input 'z'" in wrong.json()["error"] and "real pair" in wrong.json()["error"]


def test_triton_config_marks_complex_tensors_as_the_kserve_metadata_does(capsys, tmp_path):
    """config.pbtxt listed a complex input or output as a plain TYPE_FP64 [..., 2] tensor, nothing saying so; Triton's
    tensors have no parameters, so the model's name them, ``complex:<name>``; a server on the repository serves them."""
    w = _complex(4, 3)
    path = gc.capture(lambda z, x: {"y": z @ gc.complex(gc.tensor(w.real), gc.tensor(w.imag)), "n": x * 2},
                      z=gc.spec("complex128", ("N", 4)), x=gc.spec(gc.float64, ("N", 2))).save(tmp_path / "cx.onnx")
    result = run_cli(capsys, "deploy", "triton", path, "--repo", tmp_path / "repo", "--name", "cx",
                     "--max-batch-size", "8")
    assert result.code == 0, result.err
    config, skipped = model_config.parse((tmp_path / "repo" / "cx" / "config.pbtxt").read_text())
    assert skipped is None
    assert {k: v.string_value for k, v in config.parameters.items()} == {"complex:z": "complex128",
                                                                        "complex:y": "complex128"}
    assert [(t.name, list(t.dims)) for t in (*config.input, *config.output)] == [
        ("z", [4, 2]), ("x", [2]), ("y", [3, 2]), ("n", [2])]
    z = _complex(2, 4)
    body = {"inputs": [{"name": "z", "datatype": "FP64", "shape": [2, 4, 2], "data": _pair(z).ravel().tolist()},
                       {"name": "x", "datatype": "FP64", "shape": [2, 2], "data": [0.0] * 4}]}
    with running_server(create_app(tmp_path / "repo", backend="ort-cpu")) as address:
        meta = httpx.get(f"http://{address}/v2/models/cx", timeout=60).json()
        reply = httpx.post(f"http://{address}/v2/models/cx/infer", json=body, timeout=60).json()
    assert meta["inputs"][0]["parameters"] == {"complex": "complex128"}
    y = np.asarray(reply["outputs"][[o["name"] for o in reply["outputs"]].index("y")]["data"]).reshape(2, 3, 2)
    np.testing.assert_allclose(y[..., 0] + 1j * y[..., 1], (torch.from_numpy(z) @ torch.from_numpy(w)).numpy(),
                               rtol=1e-12, atol=1e-12)


def _l1_torch_loop(wr, wi, batches):
    """torch's SGD on F.l1_loss of the complex output and complex labels (torch's l1_loss takes complex: |y - t|)."""
    tr, ti = (torch.tensor(w, requires_grad=True) for w in (wr, wi))
    opt, losses = torch.optim.SGD([tr, ti], lr=LR), []
    for z, t in batches:
        loss = torch.nn.functional.l1_loss(torch.from_numpy(z) @ torch.complex(tr, ti), torch.from_numpy(t))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, tr.detach().numpy(), ti.detach().numpy()


def _l1_trainer(wr, wi, loss=gc.losses.l1):
    model = gc.capture(_ComplexLinear(wr, wi), z=gc.spec("complex128", ("N", 4)))
    return gc.Trainer(gc.training.generate(model, loss("y", label="t"), gc.optim.SGD(LR)), backend="numpy")


def test_l1_on_a_complex_output_trains_on_complex_labels_as_torch_s_l1_loss(capsys, tmp_path):
    """The label of a complex output was its pair only, and l1 the mean of |real| and |imag| differences over the
    pair (0.64 of torch's on a first step) where torch's l1_loss is the mean modulus |y - t|."""
    wr, wi = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    batches = [(_complex(5, 4), _complex(5, 3)) for _ in range(STEPS)]
    losses, want_r, want_i = _l1_torch_loop(wr, wi, batches)
    on_complex, on_pairs = _l1_trainer(wr, wi), _l1_trainer(wr, wi)
    assert on_complex.complex_inputs == {"z", "t"}
    for (z, t), loss in zip(batches, losses):
        got = on_complex.step({"z": z, "t": t})
        assert got == on_pairs.step({"z": z, "t": _pair(t)})
        assert got == pytest.approx(loss, rel=1e-12)
    np.testing.assert_allclose(on_complex.params["wr"], want_r, rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(on_complex.params["wi"], want_i, rtol=1e-12, atol=1e-14)
    z, t = batches[0]
    y = torch.from_numpy(z) @ torch.complex(*(torch.from_numpy(on_complex.params[n]) for n in ("wr", "wi")))
    report = on_complex.evaluate({"z": z, "t": t})  # mse and mae of the moduli: discarded the imaginary parts
    assert report["loss"] == pytest.approx(torch.nn.functional.l1_loss(y, torch.from_numpy(t)).item(), rel=1e-12)
    assert report["mae"] == pytest.approx(report["loss"], rel=1e-12)
    assert report["mse"] == pytest.approx(((y - torch.from_numpy(t)).abs() ** 2).mean().item(), rel=1e-12)
    on_complex.artifacts.save(tmp_path / "arts")
    np.savez(tmp_path / "data.npz", z=np.concatenate([b[0] for b in batches]), t=np.concatenate([b[1] for b in batches]))
    result = run_cli(capsys, "train", tmp_path / "arts", "--data", tmp_path / "data.npz", "--epochs", "1",
                     "--batch-size", "5", "-b", "numpy", "--checkpoint", tmp_path / "ckpt")
    assert result.code == 0, result.err
    trained = gc.Trainer(tmp_path / "ckpt", backend="numpy").params
    assert not np.array_equal(trained["wr"], on_complex.params["wr"])


@pytest.mark.parametrize("loss,torch_name", [(gc.losses.mse, "mse_loss"), (gc.losses.huber, "huber_loss"),
                                             (gc.losses.bce_with_logits, "binary_cross_entropy_with_logits"),
                                             (gc.losses.cross_entropy, "cross_entropy")])
def test_the_losses_torch_refuses_complex_in_are_refused_on_a_complex_output(loss, torch_name):
    """mse on a complex output was the mean over its pair's entries, half torch's mean |y - t|**2, which torch refuses."""
    kind = loss.__name__
    with pytest.raises(ValueError, match=rf"loss '{kind}' on the complex output 'y' \(complex128\[N,3\]\): torch's "
                                         rf"{torch_name} does not take complex Tensors; gc.losses.l1 does"):
        _l1_trainer(RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3)), loss)
    model = gc.capture(_ComplexLinear(RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))),
                       z=gc.spec("complex128", ("N", 4)))
    with pytest.raises(ValueError, match=rf"loss '{kind}' on the complex output 'y'"):
        gc.grad(model, loss("y", label="t"))


def test_a_grad_model_of_l1_on_a_complex_output_takes_complex_labels():
    wr, wi = RNG.standard_normal((4, 3)), RNG.standard_normal((4, 3))
    z, t = _complex(5, 4), _complex(5, 3)
    model = gc.capture(_ComplexLinear(wr, wi), z=gc.spec("complex128", ("N", 4)))
    got = gc.Session(gc.grad(model, gc.losses.l1("y", label="t")), backend="numpy").run({"z": z, "t": t})
    tr, ti = (torch.tensor(w, requires_grad=True) for w in (wr, wi))
    loss = torch.nn.functional.l1_loss(torch.from_numpy(z) @ torch.complex(tr, ti), torch.from_numpy(t))
    loss.backward()
    assert got["loss"] == pytest.approx(loss.item(), rel=1e-12)
    np.testing.assert_allclose(got["wr_grad"], tr.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got["wi_grad"], ti.grad.numpy(), rtol=1e-10, atol=1e-12)
