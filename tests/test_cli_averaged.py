"""`graphc grad --averaged`: SWA/EMA artifacts from the command line, as generate(averaged=) makes
them, trained by `graphc train` and written by `graphc export --averaged` as torch's AveragedModel."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphc as gc
from cli_util import one_line_error, run_cli
from float64_models import mlp
from trainer_models import blobs

swa_utils = gc.optim.swa_utils
DATA = blobs(24, d=4, classes=2, seed=3)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """A float64 two-layer net (``float64_models.mlp``) saved as ``net.onnx``, and ``data.npz`` (24 rows of blobs)."""
    root = tmp_path_factory.mktemp("cli_averaged")
    mlp().save(root / "net.onnx")
    np.savez(root / "data.npz", x=DATA["x"].astype(np.float64), y=DATA["y"])
    return root


def _grad(capsys, model, out, *flags):
    return run_cli(capsys, "grad", model / "net.onnx", "--loss", "cross_entropy:out:y", "--lr", "0.5",
                   "--momentum", "0.9", *flags, "-o", out)


def _unsourced(path) -> onnx.ModelProto:
    """The model at ``path`` less its nodes' source lines (the loss's: typer's frame on the CLI, this file's here)."""
    model = onnx.load(path)
    for node in model.graph.node:
        del node.metadata_props[:]
    return model


@pytest.mark.parametrize("flags, averaged", [
    (["--averaged", "ema:0.9"], swa_utils.AveragedModel(avg_fn=swa_utils.get_ema_avg_fn(0.9))),
    (["--averaged", "ema_multi"], swa_utils.AveragedModel(multi_avg_fn=swa_utils.get_ema_multi_avg_fn())),
    (["--averaged", "swa", "--averaged-start", "1", "--averaged-every", "2", "--averaged-buffers"],
     swa_utils.AveragedModel(use_buffers=True, start=1, every=2)),
    (["--averaged", "swa_multi"], swa_utils.AveragedModel(multi_avg_fn=swa_utils.get_swa_multi_avg_fn())),
])
def test_grad_averaged_writes_the_artifacts_generate_does(capsys, tmp_path, model, flags, averaged):
    result = _grad(capsys, model, tmp_path / "cli", *flags)
    assert result.code == 0, result.err
    arts = gc.training.generate(gc.load(model / "net.onnx"), gc.losses.cross_entropy("out", label="y"),
                                gc.optim.SGD(0.5, momentum=0.9), averaged=averaged)
    arts.save(tmp_path / "python")
    cli = gc.training.load(tmp_path / "cli")
    assert cli.manifest.averaging == arts.manifest.averaging
    for graph in ("train_step", "eval", "inference"):
        assert _unsourced(tmp_path / "cli" / f"{graph}.onnx") == _unsourced(tmp_path / "python" / f"{graph}.onnx")
    spec = averaged.spec()
    decay = "" if spec["decay"] is None else f" decay={spec['decay']:g}"
    assert f"; averaged {spec['fn']}{decay} from step {spec['start'] + spec['every']}" in result.out


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("flags, accumulate", [(["ema:0.8"], 1), (["swa", "--averaged-start", "1", "--averaged-every",
                                                                   "2"], 1), (["ema_multi:0.7"], 2)])
def test_grad_train_export_averaged_is_torchs_averaged_model(capsys, tmp_path, model, backend, flags, accumulate):
    """Full-batch steps (one batch an epoch, or ``--accumulate 2`` of 12 rows: the order of the rows
    changes nothing but rounding), 5 epochs, then the exported averaged model against torch's loop."""
    torch = pytest.importorskip("torch")
    assert _grad(capsys, model, tmp_path / "arts", "--averaged", *flags).code == 0
    result = run_cli(capsys, "train", tmp_path / "arts", "--data", model / "data.npz", "--epochs", "5", "--batch-size",
                     str(24 // accumulate), "--accumulate", str(accumulate), "-b", backend, "-q", "--checkpoint",
                     tmp_path / "ck")
    assert result.code == 0, result.err
    assert run_cli(capsys, "export", tmp_path / "ck", "--averaged", "-o", tmp_path / "avg.onnx").code == 0

    state = gc.training.load(tmp_path / "arts").state
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).double()
    with torch.no_grad():
        for ours, theirs in zip(("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"), net.state_dict()):
            net.state_dict()[theirs].copy_(torch.tensor(np.asarray(state[ours])))
    kind, _, decay = flags[0].partition(":")
    fn = {"ema": dict(avg_fn=torch.optim.swa_utils.get_ema_avg_fn(float(decay or 0.999))),
          "ema_multi": dict(multi_avg_fn=torch.optim.swa_utils.get_ema_multi_avg_fn(float(decay or 0.999))),
          "swa": {}}[kind]
    averaged = torch.optim.swa_utils.AveragedModel(net, **fn)
    opt = torch.optim.SGD(net.parameters(), lr=0.5, momentum=0.9)
    x, y = torch.tensor(DATA["x"], dtype=torch.float64), torch.tensor(DATA["y"])
    for step in range(1, 6):
        opt.zero_grad()
        for rows in np.array_split(np.arange(24), accumulate):
            (torch.nn.functional.cross_entropy(net(x[rows]), y[rows]) / accumulate).backward()
        opt.step()
        if kind != "swa" or (step > 1 and (step - 1) % 2 == 0):
            averaged.update_parameters(net)
    got = ort.InferenceSession(str(tmp_path / "avg.onnx"), providers=["CPUExecutionProvider"]).run(None, {"x": x.numpy()})[0]
    want = averaged(x).detach().numpy()
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert np.abs(net(x).detach().numpy() - want).max() > 1e-3  # the averaged weights are not the trained ones


@pytest.mark.parametrize("flags, message", [
    (["--averaged", "emma"], "unknown --averaged kind 'emma'; choose one of swa, swa_multi, ema, ema_multi "
     "(did you mean 'ema'?)"),
    (["--averaged", "swa:0.9"], "--averaged swa takes no decay (the running mean weighs step n by 1/(n+1)), got "
     "'swa:0.9'; ema:DECAY takes one"),
    (["--averaged", "ema:1.5"], "--averaged ema:DECAY: Invalid decay value 1.5 provided. Please provide a value in "
     "[0,1] range."),
    (["--averaged", "ema_multi:x"], "--averaged ema_multi:DECAY: DECAY must be a number in [0, 1], got 'x'"),
    (["--averaged-start", "3"], "--averaged-start refines the weight averaging --averaged chooses; give --averaged "
     "swa or --averaged ema:DECAY too"),
    (["--averaged-every", "2", "--averaged-buffers"], "--averaged-every, --averaged-buffers refine the weight "
     "averaging --averaged chooses; give --averaged swa or --averaged ema:DECAY too"),
])
def test_a_bad_averaged_option_is_one_line_naming_it(capsys, tmp_path, model, flags, message):
    err = one_line_error(_grad(capsys, model, tmp_path / "arts", *flags))
    assert err.strip() == f"error: ValueError: {message}"
    assert not (tmp_path / "arts").exists()


@pytest.mark.parametrize("flags, option", [(["--averaged-every", "0"], "--averaged-every"),
                                           (["--averaged-start", "-1"], "--averaged-start")])
def test_averaged_steps_out_of_range_are_usage_errors(capsys, tmp_path, model, flags, option):
    result = _grad(capsys, model, tmp_path / "arts", "--averaged", "swa", *flags)
    assert result.code == 2 and f"Invalid value for '{option}'" in result.err
    assert not (tmp_path / "arts").exists()


def test_inspect_says_how_the_artifacts_average_and_scale(capsys, tmp_path, model):
    assert _grad(capsys, model, tmp_path / "arts", "--averaged", "swa", "--averaged-start", "5", "--averaged-every",
                 "2", "--averaged-buffers", "--loss-scale", "dynamic").code == 0
    out = run_cli(capsys, "inspect", tmp_path / "arts").out
    assert "precision: loss scale dynamic from 65536" in out
    assert ("weight averaging: swa from step 7, every 2 steps, buffers averaged too; an averaged copy of 4 params and "
            "buffers (graphc export --averaged writes it)") in out
    facts = json.loads(run_cli(capsys, "inspect", tmp_path / "arts", "--json").out)
    assert facts["averaging"] == {"fn": "swa", "decay": None, "use_buffers": True, "start": 5, "every": 2, "copies": 4}
    assert _grad(capsys, model, tmp_path / "plain").code == 0
    plain = run_cli(capsys, "inspect", tmp_path / "plain").out
    assert "weight averaging" not in plain and "precision" not in plain
    facts = json.loads(run_cli(capsys, "inspect", tmp_path / "plain", "--json").out)
    assert facts["averaging"] is None and facts["loss_scale"] is None


def test_export_averaged_of_plain_artifacts_names_the_cli_option(capsys, tmp_path, model):
    assert _grad(capsys, model, tmp_path / "arts").code == 0
    err = one_line_error(run_cli(capsys, "export", tmp_path / "arts", "--averaged", "--allow-untrained", "-o",
                                 tmp_path / "m.onnx"))
    assert "keep no averaged weights" in err and "graphc grad --averaged swa|ema:DECAY" in err
    assert not (tmp_path / "m.onnx").exists()
