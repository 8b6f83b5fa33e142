"""CLI polish, round 2: `graphc inspect --json` on training artifacts and checkpoints (the text
form's facts, checked against the manifest's and the safetensors headers' own bytes and against
the steps a run took), and options a backend ignores (`--threads` on numpy, `--cuda-graph` off
ort-cuda) refused where the user named that backend, warned about and left out where `auto` chose it."""

from __future__ import annotations

import json
import math
import struct

import numpy as np
import pytest

import graphc as gc
from cli_util import one_line_error, record_trainers, run_cli, workspace

EPOCHS, BATCH, SAMPLES = 2, 16, 64  # workspace's data.npz holds 64 samples


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """``workspace`` plus ``ck``: EPOCHS epochs trained from ``arts`` in batches of BATCH (seed 3), and x.npy."""
    root = workspace(tmp_path_factory.mktemp("cli_round2"))
    np.save(root / "x.npy", np.ones((2, 8), np.float32))
    trainer = gc.Trainer(root / "arts", backend="numpy", seed=5)
    data = dict(np.load(root / "data.npz"))
    trainer.fit(gc.data.DataLoader(data, batch_size=BATCH, seed=3), epochs=EPOCHS, progress=False, quiet=True)
    trainer.save_checkpoint(root / "ck")
    return root


def safetensors_header(path) -> dict:
    """A .safetensors file's header as the format lays it out: 8 bytes of length, then JSON."""
    raw = path.read_bytes()
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + size])
    header.pop("__metadata__", None)
    return header


def inspect_json(capsys, path) -> dict:
    result = run_cli(capsys, "inspect", path, "--json")
    assert result.code == 0 and not result.err, result.err
    return json.loads(result.out)


def test_inspect_json_of_training_artifacts(capsys, ws):
    said = inspect_json(capsys, ws / "arts")
    manifest = json.loads((ws / "arts" / "manifest.json").read_text())
    state = safetensors_header(ws / "arts" / "state.safetensors")
    assert (said["kind"], said["format"], said["opset"]) == ("artifacts", manifest["format"], manifest["opset"])
    assert said["params"]["trainable"] == manifest["trainable"] and len(manifest["trainable"]) == 4
    assert said["params"]["frozen"] == manifest["frozen"] and said["params"]["constants"] == list(manifest["constants"])
    # the mlp's 8 -> 16 -> 3 params, counted from the initial state's header: 8*16 + 16 + 16*3 + 3
    assert said["params"]["trainable_elements"] == sum(math.prod(state[n]["shape"]) for n in manifest["trainable"]) == 195
    assert said["initial_state"] == {"file": "state.safetensors", "bytes": (ws / "arts" / "state.safetensors").stat().st_size}
    assert said["loss"]["kind"] == "cross_entropy" and (said["loss"]["output"], said["loss"]["label"]) == ("logits", "y")
    assert said["optimizer"]["kind"] == "adam" and said["optimizer"]["settings"]["lr"] == 0.01
    assert [(b["name"], b["role"], b["dtype"]) for b in said["batch_inputs"]] == [("x", "data", "float32"),
                                                                                 ("y", "label", "int64")]
    assert said["graphs"] == {key: graph["file"] for key, graph in manifest["graphs"].items()}
    text = run_cli(capsys, "inspect", ws / "arts").out  # the same facts as the text form
    assert "params: 4 trainable (195 elements), 0 frozen" in text and f"{said['initial_state']['bytes']:,} bytes" in text


@pytest.mark.parametrize("given", ["ck", "ck/checkpoint.safetensors"])
def test_inspect_json_of_a_checkpoint(capsys, ws, given):
    said = inspect_json(capsys, ws / given)
    header = safetensors_header(ws / "ck" / "checkpoint.safetensors")
    manifest = json.loads((ws / "arts" / "manifest.json").read_text())
    assert said["kind"] == "checkpoint" and said["path"] == str(ws / "ck" / "checkpoint.safetensors")
    assert said["bytes"] == (ws / "ck" / "checkpoint.safetensors").stat().st_size
    # the run's steps: 64 samples in batches of 16 for 2 epochs
    assert (said["step"], said["epochs_done"], said["batches_into_epoch"]) == (EPOCHS * SAMPLES // BATCH, EPOCHS, 0)
    assert (said["backend"], said["seed"]) == ("numpy", 5)
    assert said["data"] == {"samples": SAMPLES, "batch_size": BATCH, "shuffle": True, "seed": 3, "drop_last": False}
    assert said["tensors"]["count"] == len(header)
    assert said["tensors"]["elements_by_role"]["param"] == sum(math.prod(header[n]["shape"]) for n in manifest["trainable"])
    assert said["artifacts"] == inspect_json(capsys, said["artifacts"]["path"])
    assert said["artifacts"]["params"]["trainable"] == manifest["trainable"]
    text = run_cli(capsys, "inspect", ws / given).out
    assert f"run: step {said['step']}, 2 epochs done; backend numpy, seed 5" in text


def test_inspect_json_still_refuses_dim_on_training_artifacts(capsys, ws):
    assert "--dim" in one_line_error(run_cli(capsys, "inspect", ws / "arts", "--json", "--dim", "N=4"))


@pytest.mark.parametrize("args, said", [
    (["run", "{ws}/mlp.onnx", "-b", "numpy", "--threads", "2", "-i", "x={ws}/x.npy", "-o", "{ws}/o.npz"],
     "--threads 2 sets onnxruntime's intra-op threads, which the numpy backend does not have"),
    (["serve", "{ws}/mlp.onnx", "-b", "numpy", "--threads", "2", "--port", "0"],
     "--threads 2 sets onnxruntime's intra-op threads, which the numpy backend does not have"),
    (["train", "{ws}/arts", "--data", "{ws}/data.npz", "--epochs", "1", "--batch-size", "8", "-b", "ort-cpu",
      "--cuda-graph"], "--cuda-graph sets the CUDA provider's CUDA graphs, which the ort-cpu backend does not have"),
], ids=["run", "serve", "train"])
def test_an_option_the_named_backend_ignores_is_refused(capsys, ws, monkeypatch, args, said):
    """`graphc run --threads 2 -b numpy` ran on numpy, the option silently dropped (a server that
    would start fails the test instead)."""
    from graphc.serving import serve

    monkeypatch.setattr(serve, "serve", lambda *a, **k: pytest.fail("served, the option not refused"))
    err = one_line_error(run_cli(capsys, *(a.format(ws=ws) for a in args)))
    assert said in err and "leave" in err, err
    assert not (ws / "o.npz").exists()


def test_an_option_auto_chose_a_backend_for_that_ignores_it_is_warned_about_and_left_out(capsys, ws, monkeypatch):
    from graphc import backends
    from graphc.runtime import session

    real = backends.get_backend
    monkeypatch.setattr(backends, "get_backend", lambda name="auto": real("numpy" if name == "auto" else name))
    made = []

    class Recorded(session.Session):
        def __init__(self, model, backend="auto", **options):
            made.append(options)
            super().__init__(model, backend="numpy", **options)

    monkeypatch.setattr(session, "Session", Recorded)
    result = run_cli(capsys, "run", ws / "mlp.onnx", "--threads", "2", "-i", f"x={ws / 'x.npy'}", "-o", ws / "auto.npz")
    assert result.code == 0, result.err
    assert result.err.startswith("warning: --threads 2 sets onnxruntime's intra-op threads, which the numpy backend")
    assert "-b auto chose numpy, so --threads is left out" in result.err and made == [{}]
    assert np.load(ws / "auto.npz")["logits"].shape == (2, 3)


def test_an_option_the_backend_acts_on_reaches_it(capsys, ws, monkeypatch):
    from graphc.runtime import session

    made = []

    class Recorded(session.Session):
        def __init__(self, model, backend="auto", **options):
            made.append((backend, options))
            super().__init__(model, backend=backend, **options)

    monkeypatch.setattr(session, "Session", Recorded)
    result = run_cli(capsys, "run", ws / "mlp.onnx", "-b", "ort-cpu", "--threads", "1", "-i", f"x={ws / 'x.npy'}")
    assert result.code == 0 and not result.err, result.err
    assert made == [("ort-cpu", {"threads": 1})]


@pytest.mark.parametrize("command", [["run", "{ws}/mlp.onnx", "-i", "x={ws}/x.npy"], ["serve", "{ws}/mlp.onnx"]],
                         ids=lambda c: c[0])
def test_threads_is_one_option_alike_on_run_and_serve(capsys, ws, monkeypatch, command):
    """A negative --threads was the backend's error naming `threads` (run), and serve's help gave no default."""
    import typer

    from graphc.cli import app
    from graphc.serving import serve

    monkeypatch.setattr(serve, "serve", lambda *a, **k: pytest.fail("served a negative --threads"))
    result = run_cli(capsys, *(a.format(ws=ws) for a in command), "-b", "ort-cpu", "--threads", "-1")
    assert result.code == 2 and "Invalid value for '--threads'" in result.err, result.err
    helps = {name: next(p.help for p in typer.main.get_command(app).commands[name].params if p.name == "threads")
             for name in ("run", "serve")}
    assert helps["serve"] == helps["run"].replace("threads", "threads per model", 1)
    assert "default or 0: onnxruntime's own count" in helps["run"]


def test_train_json_is_the_runs_summary(capsys, ws, tmp_path):
    """A script reading train's final metrics parsed the `done: ...` line; --json gives them as the --log records."""
    args = ("train", ws / "arts", "--data", ws / "data.npz", "--epochs", "2", "--batch-size", str(BATCH), "-b", "numpy",
            "--checkpoint", tmp_path / "ck", "--log", tmp_path / "epochs.jsonl")
    result = run_cli(capsys, *args, "--json")
    assert result.code == 0, result.err
    said = json.loads(result.out)  # stdout is the one document; the run's lines went to stderr
    assert "training on numpy" in result.err and "done: loss" in result.err
    logged = [json.loads(line) for line in (tmp_path / "epochs.jsonl").read_text().splitlines()]
    assert said["epochs"] == logged
    assert (said["backend"], said["epochs_done"]) == ("numpy", 2)
    assert said["steps"] == gc.runtime.checkpoint.read_meta(tmp_path / "ck").step == 2 * SAMPLES // BATCH
    assert (said["checkpoint"], said["log"], said["plot"]) == (str(tmp_path / "ck"), str(tmp_path / "epochs.jsonl"), None)
    again = run_cli(capsys, *args, "--resume", "--json")  # nothing left to train: still one document
    assert again.code == 0 and json.loads(again.out)["epochs"] == [] and "nothing to train" in again.err
    assert "--json prints no progress bar" in one_line_error(run_cli(capsys, *args, "--json", "--progress"))


def test_cuda_graph_reaches_the_trainer_on_ort_cuda(capsys, ws, monkeypatch):
    """The option's way to the Trainer, checked where no GPU is: the Trainer is the test's."""
    made = record_trainers(monkeypatch)
    train = ("train", ws / "arts", "--data", ws / "data.npz", "--epochs", "1", "--batch-size", "8", "-b", "ort-cuda")
    assert "the test's Trainer" in one_line_error(run_cli(capsys, *train, "--cuda-graph"))
    assert "the test's Trainer" in one_line_error(run_cli(capsys, *train))
    assert [(k["backend"], k.get("cuda_graph")) for k in made] == [("ort-cuda", True), ("ort-cuda", None)]
