"""A saved capture whose fake quantizations never saw data is served only with ``allow_uncalibrated`` /
``--allow-uncalibrated`` (``gc.serve``/``create_app``/``graphc serve`` of the file, an optimized copy or a
repository holding it refuse at load, ``ModelLoadError``, exit 2); ``gc.optimize``/``graphc optimize`` keep the
record so that refusal still comes; ``gc.deploy.triton`` writes no record (it checked), and ``graphc run``
warns."""

from __future__ import annotations

import shutil
import subprocess
import sys
import warnings

import httpx
import numpy as np
import onnx
import pytest

import graphc as gc
from graphc import nn
from graphc.errors import ModelLoadError, UncalibratedWarning
from graphc.model.quantizers import FAKE_QUANTIZERS_KEY
from graphc.models.qat_resnet import QATResNet, QLinear, act_quant
from graphc.serving.serve import create_app
from cli_util import Result, one_line_error, run_cli
from serve_util import running_server, serve_process

RNG = np.random.default_rng(0)
QUANTIZERS = "0, 1.wq, 1.aq and 1 more"
REFUSED = (r"model '{name}' version 1: {count} fake quantizations were never calibrated \({names}\): the observers "
           r"never saw data .*capture with training=True.*allow_uncalibrated=True; --allow-uncalibrated\)$")


def _raw_mlp(tmp_path):
    """A QAT MLP captured in eval mode, never calibrated (scales 1.0), saved as ``raw.onnx``."""
    net = nn.Sequential(act_quant(), QLinear(12, 16, relu=True), QLinear(16, 5, per_channel=False, out_quant=False))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UncalibratedWarning)
        return gc.capture(net, x=gc.spec("float32", ("N", 12))).save(tmp_path / "raw.onnx")


def _infer(address, model, x):
    body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape), "data": x.ravel().tolist()}]}
    reply = httpx.post(f"http://{address}/v2/models/{model}/infer", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    out = reply.json()["outputs"][0]
    return np.asarray(out["data"], np.float32).reshape(out["shape"])


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_serving_a_raw_capture_is_refused_at_load_unless_allowed(tmp_path, backend):
    path = _raw_mlp(tmp_path)
    for source in (path, gc.load(path)):
        with pytest.raises(ModelLoadError, match=REFUSED.format(name="raw" if source is path else "Sequential",
                                                               count=4, names=QUANTIZERS)):
            create_app(source, backend=backend)
    x = RNG.standard_normal((3, 12)).astype(np.float32)
    with running_server(create_app(path, backend=backend, allow_uncalibrated=True)) as address:
        got = _infer(address, "raw", x)
    np.testing.assert_allclose(got, gc.Session(path, backend=backend).run({"x": x})["output"], rtol=1e-6, atol=1e-6)


def test_an_optimized_qat_resnet_keeps_the_record_so_serving_and_deploying_it_are_refused(tmp_path):
    """``QATResNet`` captured without ``training=True``: at level 3 its logits are all 0 (every scale 1.0)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UncalibratedWarning)
        model = gc.capture(QATResNet(widths=(4, 8)), x=gc.spec("float32", ("N", 3, 16, 16)))
    optimized = gc.optimize(model, level=3)
    assert optimized.ir.metadata_props[FAKE_QUANTIZERS_KEY] == model.ir.metadata_props[FAKE_QUANTIZERS_KEY]
    x = RNG.standard_normal((2, 3, 16, 16)).astype(np.float32)
    for backend in ("numpy", "ort-cpu"):
        assert not gc.Session(optimized, backend=backend).run({"x": x})["output"].any()
    path = optimized.save(tmp_path / "resnet.onnx")
    onnx.checker.check_model(str(path), full_check=True)
    with pytest.raises(ModelLoadError, match=REFUSED.format(name="resnet", count=17,
                                                           names=r"in_q, stem\.wq, stem\.aq and 14 more")):
        create_app(path, backend="ort-cpu")
    with pytest.raises(gc.compile.export.UncalibratedError, match="17 fake quantizations"):
        gc.deploy.triton(path, tmp_path / "repo", "resnet")


def test_graphc_optimize_writes_the_record_and_graphc_serve_refuses_the_file(capsys, tmp_path):
    raw = _raw_mlp(tmp_path)
    for extra in ((), ("--dtype", "float16")):
        result = run_cli(capsys, "optimize", raw, "-O", "3", "-o", tmp_path / "opt.onnx", *extra)
        assert result.code == 0, result.err
        written = onnx.load(tmp_path / "opt.onnx")
        assert FAKE_QUANTIZERS_KEY in {p.key for p in written.metadata_props}
        # its own process with a timeout: a server that does not refuse would serve on
        served = subprocess.run([sys.executable, "-c", "from graphc.cli import main; main()", "serve",
                                 str(tmp_path / "opt.onnx"), "--port", "0"], capture_output=True, text=True, timeout=60)
        err = one_line_error(Result(served.returncode, served.stdout, served.stderr))
        assert f"ModelLoadError: model 'opt' version 1: 4 fake quantizations were never calibrated ({QUANTIZERS})" \
            in err and "--allow-uncalibrated" in err


def test_graphc_serve_allow_uncalibrated_serves_it_over_http(tmp_path):
    raw = _raw_mlp(tmp_path)
    x = RNG.standard_normal((2, 12)).astype(np.float32)
    with serve_process(str(raw), "--backend", "ort-cpu", "--allow-uncalibrated") as (_, port):
        got = _infer(f"127.0.0.1:{port}", "raw", x)
    np.testing.assert_allclose(got, gc.Session(raw, backend="ort-cpu").run({"x": x})["output"], rtol=1e-6, atol=1e-6)


def test_a_repository_serves_what_deploy_allowed_and_refuses_a_hand_placed_capture(tmp_path):
    raw, repo = _raw_mlp(tmp_path), tmp_path / "repo"
    folder = gc.deploy.triton(raw, repo, "allowed", allow_uncalibrated=True)
    written = onnx.load(folder / "1" / "model.onnx")
    assert FAKE_QUANTIZERS_KEY not in {p.key for p in written.metadata_props}  # checked at deploy, not again
    assert FAKE_QUANTIZERS_KEY in gc.load(raw).ir.metadata_props  # the source file untouched
    x = RNG.standard_normal((2, 12)).astype(np.float32)
    want = gc.Session(raw, backend="numpy").run({"x": x})["output"]
    with running_server(create_app(repo, backend="numpy")) as address:
        np.testing.assert_allclose(_infer(address, "allowed", x), want, rtol=1e-6, atol=1e-6)
    (repo / "placed" / "1").mkdir(parents=True)
    shutil.copy(raw, repo / "placed" / "1" / "model.onnx")
    with pytest.raises(ModelLoadError, match=REFUSED.format(name="placed", count=4, names=QUANTIZERS)):
        create_app(repo, backend="numpy")
    create_app(repo, backend="numpy", name="allowed")  # the other model alone
    create_app(repo, backend="numpy", allow_uncalibrated=True)


def test_graphc_run_warns_once_and_runs(capsys, tmp_path):
    raw = _raw_mlp(tmp_path)
    np.save(tmp_path / "x.npy", RNG.standard_normal((2, 12)).astype(np.float32))
    result = run_cli(capsys, "run", raw, "-i", f"x={tmp_path / 'x.npy'}", "-b", "numpy", "-o", tmp_path / "y.npz")
    assert result.code == 0 and (tmp_path / "y.npz").exists()
    lines = result.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"warning: 4 fake quantizations were never calibrated "
                                                   f"({QUANTIZERS})"), result.err
    assert lines[0].endswith("graphc deploy and graphc serve refuse it unless --allow-uncalibrated")
    plain = gc.capture(nn.Linear(12, 5), x=gc.spec("float32", ("N", 12))).save(tmp_path / "plain.onnx")
    result = run_cli(capsys, "run", plain, "-i", f"x={tmp_path / 'x.npy'}", "-b", "numpy")
    assert result.code == 0 and result.err == ""
