"""What a careless `graphc` user gets wrong, and the one line that says so: a misspelled name
answered with the close one, an out-of-range option with the value given, an ONNX model given to
`graphc train` named as such. Each fails before anything is written."""

import numpy as np
import pytest

import graphc as gc
from graphc.errors import did_you_mean, first_few

from cli_util import NET_PY, one_line_error, run_cli, workspace

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = workspace(tmp_path_factory.mktemp("cli_user_errors"))
    (root / "net.py").write_text(NET_PY + "\n\nnet = Net()\n")
    return root


TYPOS = {  # what the user typed -> (its command line, the name suggested)
    "backend": (["run", "{ws}/mlp.onnx", "-b", "nump"], "numpy"),
    "backend case": (["run", "{ws}/mlp.onnx", "-b", "NumPy"], "numpy"),
    "loss kind": (["grad", "{ws}/mlp.onnx", "--loss", "crossentropy:logits:y", "-o", "{ws}/g"], "cross_entropy"),
    "optimizer": (["grad", "{ws}/mlp.onnx", "--loss", "mse:logits", "--optimizer", "adma", "-o", "{ws}/g"], "adam"),
    "metric": (["train", "{ws}/arts", "--data", "{ws}/data.npz", "--epochs", "1", "--batch-size", "8",
                "--metric", "acuracy"], "accuracy"),
    "schedule": (["train", "{ws}/arts", "--data", "{ws}/data.npz", "--epochs", "1", "--batch-size", "8",
                  "--schedule", "cosin"], "cosine"),
    "dtype": (["optimize", "{ws}/mlp.onnx", "-o", "{ws}/o.onnx", "--dtype", "float61"], "float16"),
    "input dtype": (["capture", "{ws}/net.py:Net", "-i", "x:flaot32[N,4]", "-o", "{ws}/c.onnx"], "float32"),
    "object": (["capture", "{ws}/net.py:Nett", "-i", "x:float32[N,4]", "-o", "{ws}/c.onnx"], "Net"),
}


@pytest.mark.parametrize("case", TYPOS)
def test_a_misspelled_name_is_answered_with_the_close_one(ws, capsys, case):
    """Before, each listed the choices only (`unknown backend 'nump'; choose one of auto, ...`)."""
    args, meant = TYPOS[case]
    err = one_line_error(run_cli(capsys, *[a.format(ws=ws) for a in args]))
    assert f"(did you mean {meant!r}?)" in err, err
    assert not any((ws / name).exists() for name in ("g", "o.onnx", "c.onnx"))


def test_did_you_mean_suggests_only_near_misses():
    choices = ["auto", "ort-cuda", "ort-cpu", "numpy"]
    assert did_you_mean("nump", choices) == " (did you mean 'numpy'?)"
    assert did_you_mean("numyp", choices) == " (did you mean 'numpy'?)"  # two letters swapped: one edit
    assert did_you_mean("foo", choices) == did_you_mean("tensorflow", choices) == did_you_mean(3, choices) == ""
    assert did_you_mean("Nett", ["net", "Net"]) == " (did you mean 'Net'?)"  # the same case first
    assert did_you_mean("adma", ["adam", "adamax"]) == " (did you mean 'adam'?)"  # not difflib's 'adamax'


def test_first_few_lists_the_first_names_then_counts_the_others():
    names = [f"n{i}" for i in range(7)]
    assert first_few(names) == "n0, n1, n2 and 4 more"
    assert first_few(names[:3]) == "n0, n1, n2" and first_few([]) == ""
    assert first_few(names, 5, "; ", "; ...") == "n0; n1; n2; n3; n4; ..."
    assert first_few(names, 6, more=" (and {} more nodes)") == "n0, n1, n2, n3, n4, n5 (and 1 more nodes)"


@pytest.mark.parametrize("args, said", [
    (["optimize", "{ws}/mlp.onnx", "-o", "{ws}/o.onnx", "-O", "5"], "Input should be less than or equal to 3 (got '5')"),
    (["train", "{ws}/arts", "--data", "{ws}/data.npz", "--epochs", "0", "--batch-size", "8"],
     "Invalid value for '--epochs': Input should be greater than or equal to 1 (got '0')"),
    (["parity", "{ws}/mlp.onnx", "--rtol", "1e-3x"], "unable to parse string as a number (got '1e-3x')"),
    (["serve", "{ws}/mlp.onnx", "--port", "70000"], "less than or equal to 65535 (got '70000')"),
    (["deploy", "triton", "{ws}/mlp.onnx", "--repo", "{ws}/repo", "--name", "m", "--max-batch-size", "-3"],
     "Invalid value for '--max-batch-size': Input should be greater than or equal to 0 (got '-3')"),
])
def test_an_option_value_refused_by_its_type_is_named(ws, capsys, args, said):
    """typer 0.29 checks option values with pydantic, whose message leaves out the value (`Invalid
    value for '--epochs': Input should be greater than or equal to 1`); the error names it, on one
    line (click's usage line, hint and blank line before it made four)."""
    err = one_line_error(run_cli(capsys, *[a.format(ws=ws) for a in args]))
    command = " ".join(a for a in args[:2] if not a.startswith("{"))
    assert said in err and err.endswith(f" (graphc {command} -h: the usage)\n"), err
    assert not (ws / "o.onnx").exists()


@pytest.mark.parametrize("args, said", [
    (["train"], "error: Missing argument 'ARTIFACT_DIR'. (graphc train -h: the usage)"),
    (["inspct"], "error: No such command 'inspct'. Did you mean 'inspect'? (graphc -h: the usage)"),
    (["deploy", "trito"], "error: No such command 'trito'. Did you mean 'triton'? (graphc deploy -h: the usage)"),
    (["inspect", "--nope", "m.onnx"], "error: No such option: --nope (graphc inspect -h: the usage)"),
    (["capture", "x.py:Net", "-o", "m.onnx"], "error: Missing option '--input' / '-i'. (graphc capture -h: the usage)"),
    (["inspect", "m.onnx", "extra"], "error: Got unexpected extra argument(s) (extra) (graphc inspect -h: the usage)"),
])
def test_a_usage_error_is_one_line(capsys, args, said):
    assert one_line_error(run_cli(capsys, *args)).startswith(said)


@pytest.mark.parametrize("extra", [[], ["--checkpoint", "ck"]])
def test_train_given_an_onnx_model_says_to_generate_artifacts(ws, capsys, extra):
    """Before, `graphc train mlp.onnx` read the model as a checkpoint: "not a readable graphc
    checkpoint (not a safetensors file, ...)"."""
    err = one_line_error(run_cli(capsys, "train", ws / "mlp.onnx", "--data", ws / "data.npz", "--epochs", "1",
                                 "--batch-size", "8", *extra))
    assert f"InputError: {ws / 'mlp.onnx'} is an ONNX model, not training artifacts or a checkpoint" in err, err
    assert f"graphc grad {ws / 'mlp.onnx'} --loss KIND:OUTPUT -o DIR" in err, err
    assert "checkpoint (not a safetensors" not in err and not (ws / "ck").exists()
    with pytest.raises(gc.InputError, match="is an ONNX model"):
        gc.Trainer(ws / "mlp.onnx", backend="numpy")


def test_train_of_a_missing_path_says_nothing_is_there(ws, capsys):
    """Before: "no training artifacts here (no manifest.json)", as for a folder holding other files."""
    err = one_line_error(run_cli(capsys, "train", ws / "nothing", "--data", ws / "data.npz", "--epochs", "1",
                                 "--batch-size", "8"))
    assert f"FileNotFoundError: {ws / 'nothing'}: no such artifact directory or checkpoint" in err, err


def _interrupt(*_, **__):
    raise KeyboardInterrupt


INTERRUPTED = {  # command -> (its command line, what Ctrl-C cuts short, the line said)
    "capture": (["capture", "{ws}/net.py:Net", "-i", "x:float32[N,4]", "-o", "{ws}/c.onnx"], "graphc.Model.save",
                "interrupted: nothing written"),
    "run": (["run", "{ws}/mlp.onnx", "-i", "x={ws}/x.npy", "-o", "{ws}/r.npz"], "graphc.fileio.write_synced",
            "interrupted: nothing written"),
    "optimize": (["optimize", "{ws}/mlp.onnx", "-o", "{ws}/o.onnx"], "graphc.Model.save",
                 "interrupted: nothing written"),
    "grad, after its save": (["grad", "{ws}/mlp.onnx", "--loss", "mse:logits", "-o", "{ws}/g2"],
                             "graphc.cli.grad_cmds.console.print", "interrupted after writing {ws}/g2 (kept)"),
    "train": (["train", "{ws}/arts", "--data", "{ws}/data.npz", "--epochs", "1", "--batch-size", "8", "-q"],
              "graphc.Trainer.fit", "interrupted at step 0; no --checkpoint given: the trained params were not saved"),
}


@pytest.mark.parametrize("case", INTERRUPTED)
def test_ctrl_c_in_any_command_says_what_was_written(ws, capsys, monkeypatch, case):
    """Before, every command but a checkpointing `train` exited 130 saying nothing (typer's handling)."""
    args, target, said = INTERRUPTED[case]
    np.save(ws / "x.npy", RNG.standard_normal((3, 8)).astype(np.float32))
    monkeypatch.setattr(target, _interrupt)
    result = run_cli(capsys, *[a.format(ws=ws) for a in args])
    assert result.code == 130 and result.err.strip() == said.format(ws=ws), result
    assert not any((ws / name).exists() for name in ("c.onnx", "r.npz", "o.onnx"))


FOLDER_WRITERS = {  # command -> (its command line writing under {new}, what Ctrl-C cuts short)
    "grad": (["grad", "{ws}/mlp.onnx", "--loss", "mse:logits", "-o", "{new}/g"], "graphc.compile.training.write_synced"),
    "export": (["export", "{ws}/arts", "-o", "{new}/e.onnx", "--allow-untrained"], "graphc.model.sync_tree"),
    "deploy": (["deploy", "triton", "{ws}/mlp.onnx", "--repo", "{new}/repo", "--name", "m"], "graphc.model.sync_tree"),
    "train checkpoint": (["train", "{ws}/arts", "--data", "{ws}/data.npz", "--epochs", "1", "--batch-size", "8",
                          "-q", "--checkpoint", "{new}/ck"], "graphc.runtime.checkpoint.atomic_write"),
}


@pytest.mark.parametrize("case", FOLDER_WRITERS)
def test_ctrl_c_while_saving_leaves_no_new_folder(ws, tmp_path, capsys, monkeypatch, case):
    """Before, `grad -o new/g` made new/g, then saved into a temp folder inside it: a Ctrl-C in the
    save left the empty folders (export and deploy their parents, train its checkpoint folder)."""
    args, target = FOLDER_WRITERS[case]
    monkeypatch.setattr(target, _interrupt)
    result = run_cli(capsys, *[a.format(ws=ws, new=tmp_path / "new") for a in args])
    assert result.code == 130 and len(result.err.strip().splitlines()) == 1, result
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, said", [
    (["run", "{ws}/mlp.onnx", "-i", "x={ws}/x.npy", "-o", "{ws}"],
     "-o/--output {ws}: a folder, not a file; expected a file path such as {ws}/outputs.npz"),
    (["capture", "{ws}/net.py:Net", "-i", "x:float32[N,4]", "-o", "{ws}"],
     "-o/--output {ws}: a folder, not a file; expected a file path such as {ws}/model.onnx"),
    (["deploy", "triton", "{ws}/mlp.onnx", "--repo", "{ws}/data.npz", "--name", "m"],
     "--repo {ws}/data.npz: a file, not a folder"),
    (["deploy", "triton", "{ws}/arts", "--repo", "{ws}/repo", "--name", "m"],
     "{ws}/arts: training artifacts, not an ONNX model; write its inference model first: graphc export {ws}/arts "
     "-o model.onnx"),
    (["serve", "{ws}/arts"],
     "{ws}/arts: training artifacts, not an ONNX model; write its inference model first: graphc export {ws}/arts "
     "-o model.onnx, then serve model.onnx"),
    (["deploy", "triton", "{ws}/mlp.onnx", "--repo", "{ws}/repo", "--name", "m", "--dynamic-batching"],
     "--dynamic-batching lets Triton merge requests along dim 0, which needs --max-batch-size N > 0 too"),
])
def test_an_output_or_model_of_the_wrong_kind_is_named_by_its_option(ws, capsys, args, said):
    """Before: `IsADirectoryError: cannot write {ws}`, `cannot write model 'm' into the repository
    ...: File exists`, `ModelLoadError: arts: not a file (a folder or a device)` (by serve: `no models
    found`) and the API's `dynamic_batching needs max_batch_size > 0`, none naming the
    option given."""
    np.save(ws / "x.npy", RNG.standard_normal((3, 8)).astype(np.float32))
    err = one_line_error(run_cli(capsys, *[a.format(ws=ws) for a in args]))
    assert said.format(ws=ws) in err, err
    assert not (ws / "repo").exists()


@pytest.mark.parametrize("given", ["ort-gpu", "gpu", "CUDA"])
def test_a_gpu_backend_typo_is_answered_with_the_cuda_backend(ws, capsys, given):
    """Before, `-b ort-gpu` was 1 edit from ort-cpu: "(did you mean 'ort-cpu'?)"."""
    err = one_line_error(run_cli(capsys, "run", ws / "mlp.onnx", "-b", given))
    assert "(did you mean 'ort-cuda', the GPU backend?)" in err, err


def test_a_misspelled_submodule_is_answered_with_the_module_child(ws, capsys):
    """Before, nothing was suggested: dir() of a Module does not list its children."""
    err = one_line_error(run_cli(capsys, "capture", f"{ws}/net.py:net.fcc", "-i", "x:float32[N,4]", "-o",
                                 ws / "c.onnx"))
    assert "net.py has no object 'net.fcc' (did you mean 'fc'?)" in err, err


@pytest.mark.parametrize("content, said", [(b"", "expected one array saved with np.save (.npy), found a file that "
                                                 "is neither .npy nor .npz"),
                                           (None, "a folder, not a file")])
def test_class_weights_from_an_unreadable_npy_is_one_line(ws, capsys, content, said):
    """np.load of an empty file raised EOFError, which typer turns into 'Aborted!' and exit 1."""
    weights = ws / f"weights_{'folder' if content is None else 'empty'}.npy"
    weights.mkdir() if content is None else weights.write_bytes(content)
    err = one_line_error(run_cli(capsys, "grad", ws / "mlp.onnx", "--loss", "cross_entropy:logits:y",
                                 "--class-weights", weights, "-o", ws / "cw"))
    assert f"InputError: --class-weights {weights}: {said}" in err, err
    assert not (ws / "cw").exists()


@pytest.mark.parametrize("args", [["export", "{ws}/arts", "-o", "{ws}/e.onnx"],
                                  ["optimize", "{ws}/mlp.onnx", "-o", "{ws}/e.onnx"],
                                  ["deploy", "triton", "{ws}/mlp.onnx", "--repo", "{ws}/repo", "--name", "m"]])
def test_a_dtype_graphc_cannot_convert_to_is_refused_up_front(ws, capsys, args):
    """Found by convert_float after the work: export warned first that the artifacts' weights are
    untrained, then refused the dtype (two lines)."""
    err = one_line_error(run_cli(capsys, *[a.format(ws=ws) for a in args], "--dtype", "float8"))
    assert "InputError: --dtype float8: graphc converts to bfloat16 or float16 (did you mean 'float16'?)" in err, err
    assert not (ws / "e.onnx").exists() and not (ws / "repo").exists()
