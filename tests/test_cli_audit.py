"""The CLI as a new user meets it (session 50's audit): out-of-range numbers and conflicting flags
are one usage error, folders given for files are named as folders, `inspect` describes training
artifacts and checkpoints (and `view` draws their train_step graph; a .json file is named as one),
shell completion works, every --backend has -b, and SIGTERM stops `graphc train` as Ctrl-C does
(checkpoint saved). In process through ``graphc.cli.main``, except the signal test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import typer
from cli_util import one_line_error, record_trainers, run_cli, workspace

from graphc.runtime import checkpoint as ckpt
from graphc.runtime.trainer import SIGNAL_HOOK_ENV

GRAPHC = str(Path(sys.executable).parent / "graphc")


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    """``workspace`` plus ``ck``, one epoch trained from ``arts`` in batches of 16, and x.npy."""
    root = workspace(tmp_path_factory.mktemp("audit"))
    np.save(root / "x.npy", np.ones((2, 8), np.float32))
    return root


@pytest.fixture(scope="module")
def ck(ws):
    import graphc as gc

    trainer = gc.Trainer(ws / "arts", backend="numpy")
    data = dict(np.load(ws / "data.npz"))
    trainer.fit(gc.data.DataLoader(data, batch_size=16, seed=3), epochs=1, progress=False, quiet=True)
    trainer.save_checkpoint(ws / "ck")
    return ws / "ck"


def usage_error(result, option: str) -> None:
    """Click's usage error for ``option``: exit 2, its message naming the option, no traceback."""
    assert result.code == 2, (result.code, result.out, result.err)
    assert "Traceback" not in result.err and option in result.err.splitlines()[-1], result.err


@pytest.mark.parametrize("port", ["70000", "-1"])
def test_serve_port_out_of_range_is_a_usage_error(capsys, ws, port):
    usage_error(run_cli(capsys, "serve", ws / "mlp.onnx", "--port", port), "--port")


@pytest.mark.parametrize("args", [["capture", "nets.py:f", "-i", "x:float32[2]", "-o", "m.onnx"],
                                  ["parity", "mlp.onnx"], ["train", "arts", "--data", "data.npz", "--epochs", "1",
                                                           "--batch-size", "8"]], ids=lambda a: a[0])
def test_negative_seed_is_a_usage_error_naming_seed(capsys, ws, monkeypatch, args):
    monkeypatch.chdir(ws)
    usage_error(run_cli(capsys, *args, "--seed", "-1"), "--seed")


def test_every_backend_option_has_the_short_flag_b():
    from graphc.cli import app

    def leaves(command):
        for sub in getattr(command, "commands", {}).values():
            yield from leaves(sub) if hasattr(sub, "commands") else [sub]

    with_backend = {c.name: c for c in leaves(typer.main.get_command(app))
                    if any("--backend" in p.opts for p in c.params)}
    assert {"run", "train", "demo", "serve"} <= set(with_backend)
    for name, command in with_backend.items():
        backend = next(p for p in command.params if "--backend" in p.opts)
        assert "-b" in backend.opts, name


def test_train_takes_b(capsys, ws):
    r = run_cli(capsys, "train", ws / "arts", "--data", ws / "data.npz", "--epochs", "1", "--batch-size", "32", "-q",
                "-b", "numpy")
    assert r.code == 0, r.err
    assert "training on numpy" in r.out


def test_a_folder_given_for_a_file_is_named_a_folder(capsys, ws, tmp_path):
    folder = tmp_path / "m.onnx"
    folder.mkdir()
    assert "a folder" in one_line_error(run_cli(capsys, "view", folder, "-o", tmp_path / "v.svg"))
    assert not (tmp_path / "v.svg").exists()
    err = one_line_error(run_cli(capsys, "train", ws / "arts", "--data", tmp_path, "--epochs", "1",
                                 "--batch-size", "8"))
    assert f"--data {tmp_path}: a folder, not a file" in err
    assert "a folder, not a file" in one_line_error(run_cli(capsys, "run", ws / "mlp.onnx", "-i", f"x={tmp_path}"))


def test_run_batch_size_without_workers_is_refused(capsys, ws, tmp_path):
    r = run_cli(capsys, "run", ws / "mlp.onnx", "-b", "numpy", "-i", f"x={ws / 'x.npy'}", "--batch-size", "8",
                "-o", tmp_path / "o.npz")
    assert "--workers" in one_line_error(r)
    assert not (tmp_path / "o.npz").exists()


def test_placement_reaches_the_trainer_with_workers_and_is_refused_without(capsys, ws, monkeypatch):
    """``--placement`` goes to ``gc.Trainer(placement=...)`` with ``--workers N`` (N > 1); without them, or
    naming neither default nor spread, it is one usage error naming the options, before any Trainer."""
    made = record_trainers(monkeypatch)
    train = ("train", ws / "arts", "--data", ws / "data.npz", "--epochs", "1", "--batch-size", "8")
    for extra, placement in ((("--placement", "spread"), "spread"), ((), "default")):
        assert "the test's Trainer" in one_line_error(run_cli(capsys, *train, "--workers", "2", *extra))
        assert (made[-1]["workers"], made[-1]["placement"]) == (2, placement)
    one_line_error(run_cli(capsys, *train))
    assert "placement" not in made[-1]  # the one-process Trainer takes none
    tried = len(made)
    err = one_line_error(run_cli(capsys, *train, "--placement", "spread"))
    assert "--placement spread" in err and "--workers N (N > 1)" in err
    err = one_line_error(run_cli(capsys, *train, "--workers", "2", "--placement", "spreed"))
    assert "--placement 'spreed': expected one of default, spread (did you mean 'spread'?)" in err
    assert len(made) == tried


def test_shard_optimizer_reaches_the_trainer_with_workers_and_is_refused_without(capsys, ws, monkeypatch):
    """``--shard-optimizer`` goes to ``gc.Trainer(shard_optimizer=True)`` with ``--workers N`` (N > 1);
    without them it is one usage error, before any Trainer."""
    made = record_trainers(monkeypatch)
    train = ("train", ws / "arts", "--data", ws / "data.npz", "--epochs", "1", "--batch-size", "8")
    assert "the test's Trainer" in one_line_error(run_cli(capsys, *train, "--workers", "2", "--shard-optimizer"))
    assert made[-1]["shard_optimizer"] is True
    err = one_line_error(run_cli(capsys, *train, "--shard-optimizer"))
    assert "--shard-optimizer splits the optimizer update between the --workers: give --workers N (N > 1)" in err
    assert len(made) == 1


def test_grad_norm_type_without_max_grad_norm_is_refused(capsys, ws, tmp_path):
    r = run_cli(capsys, "grad", ws / "mlp.onnx", "--loss", "cross_entropy:logits:y", "--grad-norm-type", "1",
                "-o", tmp_path / "arts")
    assert "--max-grad-norm" in one_line_error(r)
    assert not (tmp_path / "arts").exists()


def test_quiet_with_progress_is_refused(capsys, ws):
    r = run_cli(capsys, "train", ws / "arts", "--data", ws / "data.npz", "--epochs", "1", "--batch-size", "8",
                "-q", "--progress")
    assert "--quiet" in one_line_error(r) and not r.out


def test_optimizer_spec_error_says_the_value_once(capsys, ws, tmp_path):
    r = run_cli(capsys, "grad", ws / "mlp.onnx", "--loss", "cross_entropy:logits:y", "--max-grad-norm", "1",
                "--grad-norm-type", "3", "-o", tmp_path / "arts")
    err = one_line_error(r)
    assert "grad_norm_type" in err and err.count("3.0") == 1, err


def test_inspect_training_artifacts(capsys, ws):
    r = run_cli(capsys, "inspect", ws / "arts")
    assert r.code == 0, r.err
    assert "training artifacts" in r.out and "loss: cross_entropy on 'logits' (label input 'y')" in r.out
    assert "optimizer: adam lr=0.01" in r.out
    assert "params: 4 trainable" in r.out  # enc.weight, enc.bias, the Constant-node weight, head.bias
    assert "│ y    │ label │ int64" in r.out


@pytest.mark.parametrize("given", ["ck", "ck/checkpoint.safetensors"])
def test_inspect_checkpoint(capsys, ws, ck, given):
    r = run_cli(capsys, "inspect", ws / given)
    assert r.code == 0, r.err
    meta = ckpt.read_meta(ck)
    assert f"run: step {meta.step}, 1 epoch done; backend numpy, seed 0" in r.out
    assert "hyper 1 element, " in r.out  # Adam's lr; it said "1 elements"
    assert "data: 64 samples in batches of 16 (shuffled, seed 3)" in r.out
    assert "training graphs:" in r.out and "optimizer: adam" in r.out


def test_inspect_folder_of_neither_and_dim_on_artifacts(capsys, ws, tmp_path):
    err = one_line_error(run_cli(capsys, "inspect", tmp_path))
    assert "manifest.json" in err and "checkpoint.safetensors" in err
    assert "--dim" in one_line_error(run_cli(capsys, "inspect", ws / "arts", "--dim", "N=4"))
    assert "not a checkpoint" in one_line_error(run_cli(capsys, "inspect", ws / "arts" / "state.safetensors"))


def test_shell_completion_script_and_completions(capsys):
    r = run_cli(capsys, "--show-completion", "bash")
    assert r.code == 0 and "_graphc_completion" in r.out and "complete " in r.out, r
    env = {**os.environ, "_GRAPHC_COMPLETE": "complete_bash", "COMP_WORDS": "graphc tr", "COMP_CWORD": "1"}
    done = subprocess.run([GRAPHC], check=False, capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0 and done.stdout.split() == ["train"], done


def test_sigterm_stops_train_as_ctrl_c_does(capsys, ws, tmp_path):
    """A scheduler's SIGTERM after step 3: the step ends, the checkpoint is saved, exit 130; --resume
    says where in the epoch it goes on."""
    env = {**os.environ, SIGNAL_HOOK_ENV: "TERM:3"}
    done = subprocess.run([GRAPHC, "train", ws / "arts", "--data", ws / "data.npz", "--epochs", "2", "--batch-size",
                           "8", "-b", "numpy", "-q", "--checkpoint", tmp_path / "ck"],
                          check=False, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 130, (done.returncode, done.stderr)
    assert "interrupted at step 3; saved" in done.stderr
    assert ckpt.read_meta(tmp_path / "ck").step == 3
    r = run_cli(capsys, "train", ws / "arts", "--data", ws / "data.npz", "--epochs", "1", "--batch-size", "8", "-b",
                "numpy", "-q", "--checkpoint", tmp_path / "ck", "--resume")
    assert r.code == 0, r.err
    assert f"resumed from {tmp_path / 'ck'} in epoch 1, after 3 batches (step 3)" in r.out, r.out


def test_sigterm_ends_a_train_started_with_sigint_ignored(ws, tmp_path):
    """Started with ``&`` from a script, SIGINT is ignored: SIGTERM, taken as a Ctrl-C the process
    then dropped, did nothing (the run went on to its last epoch). It keeps its default now: the run
    ends at once and the checkpoint saved before (step 2) is intact."""
    import signal

    env = {**os.environ, SIGNAL_HOOK_ENV: "TERM:3"}
    done = subprocess.run([GRAPHC, "train", ws / "arts", "--data", ws / "data.npz", "--epochs", "50", "--batch-size",
                           "8", "-b", "numpy", "-q", "--checkpoint", tmp_path / "ck", "--checkpoint-every", "2"],
                          check=False, capture_output=True, text=True, env=env, timeout=120,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stderr)
    assert ckpt.read_meta(tmp_path / "ck").step == 2


BF16_NET = """
import graphc as gc
from graphc import nn

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 16, dtype="bfloat16")
        self.fc2 = nn.Linear(16, 3, dtype="bfloat16")

    def forward(self, x):
        return self.fc2(gc.relu(self.fc1(x)))
"""


def test_bfloat16_model_captures_trains_resumes_exports_and_runs(capsys, ws, tmp_path):
    """.npy/.npz cannot hold bfloat16: float32 arrays are rounded to it (raw |V2 ones read back as
    it); saved bfloat16 artifacts and checkpoints read back; `run -o` writes float32."""
    import ml_dtypes

    import graphc as gc

    (tmp_path / "bf.py").write_text(BF16_NET)
    steps = [("capture", tmp_path / "bf.py:Net", "-i", "x:bfloat16[N,8]", "-o", tmp_path / "bf.onnx"),
             ("grad", tmp_path / "bf.onnx", "--loss", "cross_entropy:output:y", "--optimizer", "adamw", "--lr", "0.01",
              "-o", tmp_path / "arts"),
             ("train", tmp_path / "arts", "--data", ws / "data.npz", "--epochs", "1", "--batch-size", "16", "-q", "-b",
              "numpy", "--checkpoint", tmp_path / "ck"),
             ("train", tmp_path / "arts", "--data", ws / "data.npz", "--epochs", "2", "--batch-size", "16", "-q", "-b",
              "numpy", "--checkpoint", tmp_path / "ck", "--resume"),
             ("export", tmp_path / "ck", "-o", tmp_path / "trained.onnx")]
    for args in steps:
        r = run_cli(capsys, *args)
        assert r.code == 0, (args[0], r.err)
    assert ckpt.read_meta(tmp_path / "ck").epoch == 2
    x = np.random.default_rng(0).standard_normal((5, 8)).astype(np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "x_raw.npy", x.astype(ml_dtypes.bfloat16))  # np.save writes it as |V2
    expected = gc.Session(tmp_path / "trained.onnx", backend="numpy").run(
        {"x": x.astype(ml_dtypes.bfloat16)})["output"].astype(np.float32)
    for given, out in (("x.npy", "o.npz"), ("x_raw.npy", "o_raw.npz")):
        r = run_cli(capsys, "run", tmp_path / "trained.onnx", "-b", "numpy", "-i", f"x={tmp_path / given}", "-o",
                    tmp_path / out)
        assert r.code == 0, r.err
        got = np.load(tmp_path / out)["output"]
        assert got.dtype == np.float32 and np.array_equal(got, expected), given
    r = run_cli(capsys, "parity", tmp_path / "trained.onnx", "-i", f"x={tmp_path / 'x.npy'}")
    assert r.code == 0 and "parity OK" in r.out, r.err


@pytest.mark.parametrize("flags, spec", [
    (["--optimizer", "sgd", "--momentum", "0.9", "--nesterov"], lambda optim: optim.SGD(momentum=0.9, nesterov=True)),
    (["--optimizer", "adam", "--betas", "0.8,0.99", "--eps", "1e-6"],
     lambda optim: optim.Adam(betas=(0.8, 0.99), eps=1e-6)),
], ids=["nesterov", "betas-eps"])
def test_grad_reaches_every_optimizer_setting(capsys, ws, tmp_path, flags, spec):
    """The manifest `graphc grad` writes holds the spec the Python API builds from the same values."""
    import json

    from graphc.compile import optim

    r = run_cli(capsys, "grad", ws / "mlp.onnx", "--loss", "cross_entropy:logits:y", *flags, "-o", tmp_path / "arts")
    assert r.code == 0, r.err
    written = json.loads((tmp_path / "arts" / "manifest.json").read_text())["optimizer"]
    assert written == json.loads(spec(optim).model_dump_json())


@pytest.mark.parametrize("flags, problem", [(["--nesterov"], "needs momentum"), (["--betas", "0.9"], "two numbers"),
                                            (["--optimizer", "adam", "--betas", "1.5,0.9"], "[0, 1)"),
                                            (["--eps", "1e-6"], "applies to adam and adamw")])
def test_grad_optimizer_setting_errors(capsys, ws, tmp_path, flags, problem):
    r = run_cli(capsys, "grad", ws / "mlp.onnx", "--loss", "cross_entropy:logits:y", *flags, "-o", tmp_path / "arts")
    err = one_line_error(r)
    assert problem in err and "(got {" not in err, err
    assert not (tmp_path / "arts").exists()


@pytest.mark.parametrize("model, flags, said", [
    ("mlp", [], None), ("mlp", ["--batchnorm", "frozen"], "--batchnorm frozen: the model has no BatchNorm"),
    ("bn", [], "BatchNorm train"), ("bn", ["--batchnorm", "frozen"], "BatchNorm frozen"),
], ids=["no-bn", "no-bn-frozen", "bn", "bn-frozen"])
def test_grad_summary_names_batchnorm_only_for_a_model_with_one(capsys, ws, tmp_path, model, flags, said):
    """A model without BatchNorm nodes (an exporter folded them into the Convs; here an MLP) gets no
    'BatchNorm train' in the summary line; one with them says how they train."""
    import graphc as gc
    from trainer_models import BNNet

    gc.capture(BNNet(), seed=0, x=gc.spec("float32", ("N", 8))).save(tmp_path / "bn.onnx")
    source = ws / "mlp.onnx" if model == "mlp" else tmp_path / "bn.onnx"
    r = run_cli(capsys, "grad", source, "--loss", "cross_entropy:logits:y", *flags, "-o", tmp_path / "arts")
    assert r.code == 0, r.err
    summary = r.out.replace("\n", "").split("trainable:")[0]
    assert (said is None and "BatchNorm" not in summary) or f"; {said}" in summary, summary


def test_train_summary_names_the_plot(capsys, ws, tmp_path):
    pytest.importorskip("matplotlib")
    r = run_cli(capsys, "train", ws / "arts", "--data", ws / "data.npz", "--epochs", "1", "--batch-size", "32", "-q",
                "-b", "numpy", "--plot", tmp_path / "loss.png")
    assert r.code == 0, r.err
    assert f"loss curve: {tmp_path / 'loss.png'}" in r.out.replace("\n", "")
    assert (tmp_path / "loss.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_seed_option_is_named_seed_and_non_negative():
    """Each command that draws numbers (capture, parity, train, demo) takes --seed, >= 0."""
    from graphc.cli import app

    commands = typer.main.get_command(app).commands
    for name in ("capture", "parity", "train", "demo"):
        seed = next((p for p in commands[name].params if "--seed" in p.opts), None)
        assert seed is not None and seed.min == 0, name


@pytest.mark.parametrize("spec, dim", [("x:float32[N,,8]", "''"), ("x:float32[N,8,]", "''"), ("x:float32[3.5,8]", "'3.5'"),
                                       ("x:float32[N+1,8]", "'N+1'")])
def test_capture_refuses_a_dim_that_is_no_size_or_name(capsys, tmp_path, spec, dim):
    """Such a dim was dropped (an empty one) or became a symbolic dim of that name."""
    (tmp_path / "f.py").write_text("import graphc as gc\n\ndef f(x):\n    return gc.relu(x)\n")
    err = one_line_error(run_cli(capsys, "capture", tmp_path / "f.py:f", "-i", spec, "-o", tmp_path / "m.onnx"))
    assert f"dim {dim} is neither a size" in err
    assert not (tmp_path / "m.onnx").exists()


def test_capture_takes_sizes_names_unknown_dims_and_scalars(capsys, tmp_path):
    import graphc as gc

    (tmp_path / "f.py").write_text("import graphc as gc\n\ndef f(x, s):\n    return gc.relu(x) * s\n")
    r = run_cli(capsys, "capture", tmp_path / "f.py:f", "-i", "x:float32[batch_1, ?, 8]", "-i", "s:float32[]", "-o",
                tmp_path / "m.onnx")
    assert r.code == 0, r.err
    x, s = gc.load(tmp_path / "m.onnx").inputs
    assert x.shape[0] == "batch_1" and x.shape[2] == 8 and len(x.shape) == 3 and s.shape == ()


def _under_a_file(ws, tmp_path):
    blocker = tmp_path / "blocker.txt"
    blocker.write_text("a file")
    return blocker / "sub"


@pytest.mark.parametrize("make_args, option", [
    (lambda ws, out: ["capture", ws / "nets.py:f", "-i", "x:float32[2]", "-o", out / "m.onnx"], "-o/--output"),
    (lambda ws, out: ["optimize", ws / "mlp.onnx", "-o", out / "m.onnx"], "-o/--output"),
    (lambda ws, out: ["run", ws / "mlp.onnx", "-b", "numpy", "-i", f"x={ws / 'x.npy'}", "-o", out / "o.npz"], "-o/--output"),
    (lambda ws, out: ["grad", ws / "mlp.onnx", "--loss", "cross_entropy:logits:y", "-o", out / "arts"], "-o/--output"),
    (lambda ws, out: ["view", ws / "mlp.onnx", "-o", out / "v.svg"], "-o/--output"),
    (lambda ws, out: ["deploy", "triton", ws / "mlp.onnx", "--repo", out / "repo", "--name", "m"], "--repo"),
    *[(lambda ws, out, o=o, name=name: ["train", ws / "arts", "--data", ws / "data.npz", "--epochs", "1",
                                        "--batch-size", "8", "-q", "-b", "numpy", o, out / name], o)
      for o, name in (("--log", "h.csv"), ("--plot", "p.png"), ("--tensorboard", "tb"), ("--checkpoint", "ck"))],
], ids=["capture", "optimize", "run", "grad", "view", "deploy", "train-log", "train-plot", "train-tensorboard",
        "train-checkpoint"])
def test_an_output_under_a_file_is_refused_before_any_work(capsys, ws, tmp_path, make_args, option):
    """Found only when writing, it failed `train --plot` after the whole run, `--log` after an epoch."""
    out = _under_a_file(ws, tmp_path)
    r = run_cli(capsys, *make_args(ws, out))
    assert f"{option} {out}" in one_line_error(r) and "blocker.txt is a file, not a folder" in r.err
    assert not r.out  # nothing trained, captured or run first


def test_plot_to_a_folder_is_refused_before_training(capsys, ws, tmp_path):
    r = run_cli(capsys, "train", ws / "arts", "--data", ws / "data.npz", "--epochs", "1", "--batch-size", "8", "-q",
                "--plot", tmp_path)
    assert "--plot" in one_line_error(r) and "a folder, not a file" in r.err and not r.out


@pytest.mark.parametrize("given", ["arts", "ck", "ck/checkpoint.safetensors"])
def test_view_of_artifacts_or_checkpoint_draws_their_train_step(capsys, ws, ck, given, tmp_path):
    """`view` takes what `inspect` takes: a training folder or checkpoint shows its train_step graph."""
    r = run_cli(capsys, "view", ws / given, "-o", tmp_path / "step.svg")
    assert r.code == 0, r.err
    shown = ws / "arts" / "train_step.onnx" if given == "arts" else ck / "artifacts" / "train_step.onnx"
    assert f"showing its train_step graph {shown}" in r.out, r.out
    assert (tmp_path / "step.svg").read_text().count('class="gradient"') > 0


def test_view_of_a_checkpoint_without_its_graphs_names_what_to_pass(capsys, ws, tmp_path):
    import shutil

    import graphc as gc

    shutil.copytree(ws / "arts", tmp_path / "gone")
    lone = gc.Trainer(tmp_path / "gone", backend="numpy").save_checkpoint(tmp_path / "lone.safetensors")
    shutil.rmtree(tmp_path / "gone")
    err = one_line_error(run_cli(capsys, "view", lone, "-o", tmp_path / "x.svg"))
    assert "training graphs are not found" in err and ".onnx" in err
    assert "neither training artifacts" in one_line_error(run_cli(capsys, "view", tmp_path, "-o", tmp_path / "x.svg"))


def test_inspect_or_view_of_a_json_file_says_what_it_is(capsys, ws, ck, tmp_path):
    for command, extra in (("inspect", []), ("view", ["-o", tmp_path / "x.svg"])):
        err = one_line_error(run_cli(capsys, command, ck / "artifacts" / "manifest.json", *extra))
        assert f"the manifest of the training artifacts {ck / 'artifacts'}" in err and "pass the folder" in err, err
    (tmp_path / "m.json").write_text("{}")
    assert "a JSON file, not an ONNX model" in one_line_error(run_cli(capsys, "inspect", tmp_path / "m.json"))
