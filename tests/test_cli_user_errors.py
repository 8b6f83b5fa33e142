"""What a careless `graphc` user gets wrong, and the one line that says so: a misspelled name
answered with the close one, an out-of-range option with the value given, an ONNX model given to
`graphc train` named as such. Each fails before anything is written."""

import pytest

import graphc as gc
from graphc.errors import did_you_mean

from cli_util import one_line_error, run_cli, workspace


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = workspace(tmp_path_factory.mktemp("cli_user_errors"))
    (root / "net.py").write_text("from graphc import nn\n\n\nclass Net(nn.Module):\n"
                                 "    def __init__(self):\n        super().__init__()\n"
                                 "        self.fc = nn.Linear(4, 2)\n\n    def forward(self, x):\n"
                                 "        return self.fc(x)\n\n\nnet = Net()\n")
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


@pytest.mark.parametrize("args, said", [
    (["optimize", "{ws}/mlp.onnx", "-o", "{ws}/o.onnx", "-O", "5"], "Input should be less than or equal to 3 (got '5')"),
    (["train", "{ws}/arts", "--data", "{ws}/data.npz", "--epochs", "0", "--batch-size", "8"],
     "Invalid value for '--epochs': Input should be greater than or equal to 1 (got '0')"),
    (["parity", "{ws}/mlp.onnx", "--rtol", "1e-3x"], "unable to parse string as a number (got '1e-3x')"),
    (["serve", "{ws}/mlp.onnx", "--port", "70000"], "less than or equal to 65535 (got '70000')"),
])
def test_an_option_value_refused_by_its_type_is_named(ws, capsys, args, said):
    """typer 0.29 checks option values with pydantic, whose message leaves out the value (`Invalid
    value for '--epochs': Input should be greater than or equal to 1`); the error names it."""
    result = run_cli(capsys, *[a.format(ws=ws) for a in args])
    assert result.code == 2 and said in result.err and "Traceback" not in result.err, result.err
    assert not (ws / "o.onnx").exists()


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
