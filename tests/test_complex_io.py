"""Complex graph inputs and outputs (``graphc.model.complex_io``) against torch 2.13 in complex128/complex64, on
the numpy backend and ort-cpu: captured from numpy complex example arrays and from complex ``gc.spec``s, the
file's I/O the real ``[..., 2]`` pair (``onnx.checker`` full check), ``gc.Session.run`` taking and giving numpy
complex arrays (or the pair), ``graphc run`` on a complex ``.npy``, and the feed errors."""

from __future__ import annotations

import importlib.util
import json

import numpy as np
import onnx
import pytest
from cli_util import run_cli
from ray_util import ray_cluster  # noqa: F401 - the module's fixture

import graphc as gc

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ["numpy", "ort-cpu"]


def _spectra(m, z, x):
    """An STFT-fed model's shape of work: complex in, complex and real out."""
    return {"mixed": m.fft.fft(z) * x, "power": (z * z.conj()).real, "onesided": m.fft.rfft(x)}


def _example(dtype=np.complex128):
    z = (RNG.standard_normal((3, 8)) + 1j * RNG.standard_normal((3, 8))).astype(dtype)
    return z, RNG.standard_normal((3, 8)).astype(z.real.dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("given", ["arrays", "specs"])
def test_complex_inputs_and_outputs_run_as_numpy_complex_arrays(given, backend, tmp_path):
    z, x = _example()
    inputs = {"z": z, "x": x} if given == "arrays" else \
        {"z": gc.spec("complex128", ("N", 8)), "x": gc.spec(gc.float64, ("N", 8))}
    model = gc.capture(lambda z, x: _spectra(gc, z, x), **inputs)
    n = 3 if given == "arrays" else "N"
    assert [str(s) for s in model.inputs] == [f"z: float64[{n},8,2]", f"x: float64[{n},8]"]
    path = model.save(tmp_path / "spectra.onnx")
    onnx.checker.check_model(str(path), full_check=True)
    session = gc.Session(str(path), backend=backend)
    assert (session.complex_inputs, session.complex_outputs) == ({"z"}, {"mixed", "onesided"})
    got = session.run({"z": z, "x": x})
    want = _spectra(torch, torch.from_numpy(z), torch.from_numpy(x))
    for name, value in want.items():
        assert got[name].dtype == value.numpy().dtype and got[name].shape == tuple(value.shape), name
        np.testing.assert_allclose(got[name], value.numpy(), rtol=1e-12, atol=1e-12 * np.abs(value.numpy()).max())
    pair = np.stack([z.real, z.imag], -1)
    np.testing.assert_array_equal(session.run({"z": pair, "x": x})["mixed"], got["mixed"])
    np.testing.assert_array_equal(session.run({"z": z, "x": x}, complex_pairs=True)["mixed"],
                                  np.stack([got["mixed"].real, got["mixed"].imag], -1))


@pytest.mark.parametrize("backend", BACKENDS)
def test_complex64_round_trips_as_complex64(backend):
    z, _ = _example(np.complex64)
    model = gc.capture(lambda z: gc.fft.ifft(z * 2j, norm="ortho"), z=gc.spec(gc.cfloat, (3, 8)))
    got = gc.Session(model, backend=backend).run({"z": z})["output"]
    want = torch.fft.ifft(torch.from_numpy(z) * 2j, norm="ortho").numpy()
    assert got.dtype == np.complex64
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("feed,match", [
    (lambda z: z.astype(np.complex128), r"expected z: complex64\[3,8\] \(held as the float32\[3,8,2\] real pair\), "
                                        r"got complex128\[3,8\] \(cast it with .astype\(np.complex64\)\)"),
    (lambda z: z.real, r"got the real float32\[3,8\]: feed a complex array or the pair"),
    (lambda z: np.stack([z.real, z.imag], -1)[:, :4], "axis 1 has size 4, the model fixes it at 8"),
])
def test_a_wrong_complex_feed_is_an_input_error_naming_it(feed, match):
    z, _ = _example(np.complex64)
    session = gc.Session(gc.capture(lambda z: z.conj(), z=z), backend="numpy")
    with pytest.raises(gc.InputError, match=match):
        session.run({"z": feed(z)})


def test_a_complex_spec_of_unknown_rank_is_refused():
    with pytest.raises(gc.CaptureError, match="'z': a complex input needs a known rank"):
        gc.capture(lambda z: z.real, z=gc.spec("complex64", None))


def test_graphc_run_reads_and_writes_complex_arrays(capsys, tmp_path):
    z, x = _example()
    gc.capture(lambda z, x: _spectra(gc, z, x), z=z, x=x).save(tmp_path / "m.onnx")
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "x.npy", x)
    result = run_cli(capsys, "run", tmp_path / "m.onnx", "-b", "ort-cpu", "-i", f"z={tmp_path / 'z.npy'}",
                     "-i", f"x={tmp_path / 'x.npy'}", "-o", tmp_path / "out.npz")
    assert result.code == 0, result.err
    with np.load(tmp_path / "out.npz") as out:
        assert out["mixed"].dtype == np.complex128
        np.testing.assert_allclose(out["mixed"], np.fft.fft(z) * x, rtol=1e-12, atol=1e-12)
    result = run_cli(capsys, "run", tmp_path / "m.onnx", "-b", "ort-cpu", "-i", f"z={tmp_path / 'z.npy'}",
                     "-i", f"x={tmp_path / 'x.npy'}", "-o", tmp_path / "out.json")
    assert result.code == 0, result.err
    mixed = json.loads((tmp_path / "out.json").read_text())["mixed"]  # JSON has no complex: [re, im] pairs
    assert (mixed["dtype"], mixed["shape"]) == ("complex128", [3, 8])
    pairs = np.array(mixed["data"])
    np.testing.assert_allclose(pairs[..., 0] + 1j * pairs[..., 1], np.fft.fft(z) * x, rtol=1e-12, atol=1e-12)


@pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="needs graphc[ray]")
def test_map_batches_and_graphc_run_workers_take_and_give_complex_arrays(ray_cluster, capsys, tmp_path):
    """map_batches checked the complex feed against the pair's dtype ('expected z: float64[N,8,2], got
    complex128[6,8]'), so ``graphc run --workers 2`` refused every complex input."""
    z = RNG.standard_normal((6, 8)) + 1j * RNG.standard_normal((6, 8))
    x = RNG.standard_normal((6, 8))
    model = gc.capture(lambda z, x: _spectra(gc, z, x), z=gc.spec("complex128", ("N", 8)), x=gc.spec(gc.float64, ("N", 8)))
    one = gc.Session(model, backend="ort-cpu").run({"z": z, "x": x})
    out = gc.distributed.map_batches(model, {"z": z, "x": x}, backend="ort-cpu", batch_size=4, workers=2, num_cpus=0.5)
    for name, value in one.items():
        assert out[name].dtype == value.dtype
        np.testing.assert_array_equal(out[name], value)
    model.save(tmp_path / "m.onnx")
    np.save(tmp_path / "z.npy", z)
    np.save(tmp_path / "x.npy", x)
    result = run_cli(capsys, "run", tmp_path / "m.onnx", "-b", "numpy", "-i", f"z={tmp_path / 'z.npy'}", "-i",
                     f"x={tmp_path / 'x.npy'}", "--workers", "2", "--batch-size", "3", "-o", tmp_path / "out.npz")
    assert result.code == 0, result.err
    with np.load(tmp_path / "out.npz") as saved:
        assert saved["mixed"].dtype == np.complex128
        np.testing.assert_allclose(saved["mixed"], np.fft.fft(z) * x, rtol=1e-12, atol=1e-12)
    with pytest.raises(gc.InputError, match=r"expected z: complex128\[N,8\] .* got complex64\[6,8\]"):
        gc.distributed.map_batches(model, {"z": z.astype(np.complex64), "x": x}, backend="ort-cpu", workers=2)


class _Spectral(gc.nn.Module):
    """A complex input through fft and a real weight: a complex and a real output."""

    def __init__(self, w):
        super().__init__()
        self.w = gc.nn.Parameter(w, dtype=gc.float64)

    def forward(self, z):
        y = gc.fft.fft(z) * self.w
        return {"spec": y, "mag": y.abs().sum(-1)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_trainer_takes_and_gives_complex_arrays_and_exports_a_complex_model(backend, tmp_path):
    """The Trainer's step, predict (with or without labels) and evaluate take a complex array (or the pair) and
    predict gives a complex output complex (tests/test_complex_training.py), and its exported model is complex
    again. One SGD step equals torch's."""
    z, _ = _example()
    w, y = RNG.standard_normal(8), RNG.standard_normal(3)
    model = gc.capture(_Spectral(w), z=gc.spec("complex128", ("N", 8)))
    trainer = gc.Trainer(gc.training.generate(model, gc.losses.mse("mag", label="y"), gc.optim.SGD(0.01)),
                         backend=backend)
    tw = torch.tensor(w, requires_grad=True)
    spec = torch.fft.fft(torch.from_numpy(z)) * tw
    loss = torch.nn.functional.mse_loss(spec.abs().sum(-1), torch.from_numpy(y))
    loss.backward()
    assert trainer.step({"z": z, "y": y}) == pytest.approx(loss.item(), rel=1e-12)
    np.testing.assert_allclose(trainer.params["w"], w - 0.01 * tw.grad.numpy(), rtol=1e-12, atol=1e-14)
    for batch in ({"z": np.stack([z.real, z.imag], -1)}, {"z": z, "y": y}):
        got = trainer.predict(batch)
        assert got["spec"].dtype == np.complex128 and got["spec"].shape == (3, 8)
    exported = gc.Session(str(trainer.export_inference(tmp_path / "m.onnx")), backend=backend).run({"z": z})
    np.testing.assert_allclose(exported["spec"], np.fft.fft(z) * trainer.params["w"], rtol=1e-12, atol=1e-12)
