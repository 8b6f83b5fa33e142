"""`graphc grad | train | export` through the installed console script, in subprocesses."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

from trainer_models import blobs, imported_mlp

GRAPHC = str(Path(sys.executable).parent / "graphc")


def graphc(*args, cwd=None):
    return subprocess.run([GRAPHC, *map(str, args)], capture_output=True, text=True, cwd=cwd, timeout=120,
                          env={**os.environ, "COLUMNS": "200"})


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    root = tmp_path_factory.mktemp("cli_train")
    onnx.save(imported_mlp(), root / "mlp.onnx")
    train, test = blobs(256), blobs(64, seed=1)
    np.savez(root / "data.npz", x_train=train["x"], y_train=train["y"], x_test=test["x"], y_test=test["y"])
    return root


def test_grad_train_resume_export(workdir):
    r = graphc("grad", workdir / "mlp.onnx", "--loss", "cross_entropy:logits:y", "--optimizer", "adam",
               "--lr", "0.01", "--freeze", "enc.bias", "--device", "cuda", "-o", workdir / "arts")
    assert r.returncode == 0, r.stderr
    assert "1 frozen" in r.stdout
    assert '"device": "cuda"' in (workdir / "arts" / "manifest.json").read_text()  # trains on any backend all the same
    for name in ("train_step.onnx", "gradients.onnx", "eval.onnx", "inference.onnx", "state.safetensors", "manifest.json"):
        assert (workdir / "arts" / name).is_file()

    r = graphc("train", workdir / "arts", "--data", workdir / "data.npz", "--epochs", "2", "--batch-size", "32",
               "--backend", "ort-cpu", "--checkpoint", workdir / "ck")
    assert r.returncode == 0, r.stderr
    assert "samples/s" in r.stdout and "epoch 2/2" in r.stdout and "eval accuracy" in r.stdout
    assert (workdir / "ck" / "checkpoint.safetensors").is_file()

    r = graphc("train", workdir / "arts", "--data", workdir / "data.npz", "--epochs", "3", "--batch-size", "32",
               "--backend", "ort-cpu", "--checkpoint", workdir / "ck", "--resume")
    assert r.returncode == 0, r.stderr
    assert "resumed from" in r.stdout and "after epoch 2 (step 16)" in r.stdout and "epoch 3/3" in r.stdout and "epoch 2/3" not in r.stdout

    r = graphc("export", workdir / "ck", "-o", workdir / "model.onnx")
    assert r.returncode == 0, r.stderr
    x = blobs(64, seed=1)
    session = ort.InferenceSession(str(workdir / "model.onnx"), providers=["CPUExecutionProvider"])
    accuracy = (session.run(None, {"x": x["x"]})[0].argmax(1) == x["y"]).mean()
    assert accuracy > 0.9


def test_train_exits_1_when_the_loss_becomes_nan(workdir):
    rng = np.random.default_rng(0)
    np.savez(workdir / "wild.npz", x=rng.standard_normal((64, 8)).astype(np.float32) * 1e3,
             t=rng.standard_normal((64, 3)).astype(np.float32))
    r = graphc("grad", workdir / "mlp.onnx", "--loss", "mse:logits:t", "--lr", "1e6", "-o", workdir / "wild")
    assert r.returncode == 0, r.stderr
    r = graphc("train", workdir / "wild", "--data", workdir / "wild.npz", "--epochs", "20", "--batch-size", "8",
               "--backend", "numpy", "--no-progress")
    assert r.returncode == 1
    assert "training failed" in r.stderr and "loss became" in r.stderr


def test_bad_usage_exits_2_with_one_line(workdir):
    r = graphc("grad", workdir / "mlp.onnx", "--loss", "bogus:logits", "-o", workdir / "x")
    assert r.returncode == 2 and "unknown loss kind 'bogus'" in r.stderr and "Traceback" not in r.stderr
    r = graphc("grad", workdir / "mlp.onnx", "--loss", "cross_entropy:logits:y", "--device", "gpu", "-o", workdir / "x")
    assert r.returncode == 2 and "device must be 'cpu' or 'cuda', got 'gpu'" in r.stderr and not (workdir / "x").exists()
    np.savez(workdir / "nolabel.npz", x=np.zeros((4, 8), np.float32))
    graphc("grad", workdir / "mlp.onnx", "--loss", "cross_entropy:logits:y", "-o", workdir / "arts2")
    r = graphc("train", workdir / "arts2", "--data", workdir / "nolabel.npz", "--epochs", "1", "--batch-size", "2")
    assert r.returncode == 2 and "no array 'y'" in r.stderr
    r = graphc("export", workdir / "missing", "-o", workdir / "m.onnx")
    assert r.returncode == 2 and "missing: no such artifact directory or checkpoint" in r.stderr
    r = graphc("train", workdir / "arts2", "--data", workdir / "data.npz", "--epochs", "1", "--batch-size", "2",
               "--backend", "ort-cpu", "--cuda-graph")
    assert r.returncode == 2 and "--cuda-graph sets the CUDA provider's CUDA graphs, which the ort-cpu backend" in r.stderr
