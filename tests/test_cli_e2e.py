"""What a new user's walk through the CLI turned up: summary lines that hide the options given,
errors that name graphc's own source line, a parity table that calls agreeing NaNs infinitely off."""

from __future__ import annotations

import numpy as np
import pytest
from cli_util import one_line_error, run_cli, workspace

import graphc as gc
from graphc.runtime.parity import diff


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    return workspace(tmp_path_factory.mktemp("e2e"))


@pytest.mark.parametrize("flags", [
    ("--optimizer", "sgd", "--momentum", "0.9", "--nesterov", "--weight-decay", "0.1"),
    ("--optimizer", "rmsprop", "--centered", "--momentum", "0.5", "--alpha", "0.9"),
    ("--optimizer", "adam", "--betas", "0.8,0.99", "--eps", "1e-06", "--amsgrad"),
    ("--optimizer", "adagrad", "--lr-decay", "0.01", "--initial-accumulator-value", "0.1"),
    ("--optimizer", "nadam", "--momentum-decay", "0.01", "--decoupled-weight-decay", "--weight-decay", "0.02"),
    ("--optimizer", "adamw", "--weight-decay", "0"),
])
def test_grad_summary_names_every_option_given(capsys, ws, tmp_path, flags):
    # the summary line showed only dampening/amsgrad/maximize/decoupled_weight_decay: `--momentum 0.9
    # --nesterov` read as plain SGD; now every setting the manifest holds apart from its default
    r = run_cli(capsys, "grad", ws / "mlp.onnx", "--loss", "cross_entropy:logits:y", *flags, "-o", tmp_path / "a")
    assert r.code == 0, r.err
    summary = r.out.splitlines()[0]
    spec = gc.optim.from_dict(gc.training.read_manifest(tmp_path / "a").optimizer)
    defaults = type(spec).model_fields
    changed = [k for k, v in spec.model_dump().items() if k not in ("kind", "lr") and v != defaults[k].default]
    assert len(changed) == sum(f.startswith("--") for f in flags) - 1  # each flag but --optimizer
    for key in changed:
        assert f" {key}" in summary, (key, summary)
    assert "betas=0.8,0.99" in summary or "--betas" not in flags


def test_class_weights_of_the_wrong_count_name_both_counts(capsys, ws, tmp_path):
    # was a CaptureError naming graphc's own passes/training/loss_graph.py:65 as the user's line
    r = run_cli(capsys, "grad", ws / "mlp.onnx", "--loss", "cross_entropy:logits:y", "--class-weights", "1,2",
                "-o", tmp_path / "a")
    err = one_line_error(r)
    assert "classes and weights differ" in err and "has 3 classes" in err and "2 entries" in err, err
    assert "loss_graph.py" not in err and not (tmp_path / "a").exists()
    r = run_cli(capsys, "grad", ws / "mlp.onnx", "--loss", "cross_entropy:logits:y", "--class-weights", "1,2,1",
                "-o", tmp_path / "b")
    assert r.code == 0 and "weighted by 3 class weights" in r.out, r.err


def test_agreeing_nans_have_no_relative_error(capsys, tmp_path):
    # the parity table showed rel err inf beside abs err 0 for outputs whose NaNs agree
    nan = np.array([np.nan, 2.0], np.float32)
    assert diff("y", "ort-cpu", nan, nan.copy()).max_rel_err == 0.0
    assert diff("y", "ort-cpu", nan, np.array([1.0, 2.0], np.float32)).max_rel_err == float("inf")
    gc.capture(lambda x: gc.log(x), x=gc.spec("float32", (2,))).save(tmp_path / "log.onnx")
    np.save(tmp_path / "x.npy", np.array([-1.0, 2.0], np.float32))
    r = run_cli(capsys, "parity", tmp_path / "log.onnx", "--input", f"x={tmp_path / 'x.npy'}")
    assert r.code == 0, r.err
    row = next(line for line in r.out.splitlines() if "ort-cpu" in line and " ok" in line)
    assert "inf" not in row, r.out


@pytest.mark.parametrize("schedule", ["plateau", "onecycle"])
def test_warmup_refusal_names_what_takes_it(capsys, ws, schedule):
    r = run_cli(capsys, "train", ws / "arts", "--data", ws / "data.npz", "--epochs", "1", "--batch-size", "8",
                "--schedule", schedule, "--warmup", "1")
    err = one_line_error(r)
    assert "--warmup applies to --schedule step, exponential or cosine, not " + schedule in err, err
    assert ("onecycle warms up itself" in err) == (schedule == "onecycle"), err
