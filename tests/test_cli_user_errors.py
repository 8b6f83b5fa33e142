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
