"""Odd paths every `graphc` command meets alike: an output naming the command's own input (by any
spelling or link, or a file of an input folder) is refused before anything is read or written,
where `graphc optimize m.onnx -o m.onnx`, `graphc run ... -i x=x.npy -o x.npy`, `graphc capture
net.py:Net -o net.py` and `graphc export arts -o arts/train_step.onnx` replaced it; and a symbolic
link that loops, as an input or an output, is named as one (it read "no such file", and as an
output the link was replaced by the file)."""

import os

import numpy as np
import pytest

from cli_util import NET_PY, one_line_error, run_cli, workspace


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = workspace(tmp_path_factory.mktemp("cli_own_input"))
    (root / "net.py").write_text(NET_PY)
    np.save(root / "x.npy", np.zeros((3, 8), np.float32))
    os.symlink("mlp.onnx", root / "link.onnx")
    for name in ("loop.onnx", "loop.npy", "loop.py", "loop_dir"):
        os.symlink(name, root / name)
    return root


OWN_INPUT = [  # the command line, the input it names, what the error calls it
    (["optimize", "mlp.onnx", "-o", "mlp.onnx"], "mlp.onnx", "the same file as the input MODEL.onnx mlp.onnx"),
    (["optimize", "link.onnx", "-o", "./mlp.onnx"], "mlp.onnx", "the same file as the input MODEL.onnx link.onnx"),
    (["run", "mlp.onnx", "-i", "x=x.npy", "-o", "x.npy"], "x.npy", "the same file as the input --input x x.npy"),
    (["run", "mlp.onnx", "-i", "x=x.npy", "--out", "mlp.onnx"], "mlp.onnx", "the same file as the input MODEL.onnx mlp.onnx"),
    (["capture", "net.py:Net", "-i", "x:float32[N,4]", "-o", "net.py"], "net.py", "the input FILE.py net.py"),
    (["export", "arts", "-o", "arts/train_step.onnx", "--allow-untrained"], "arts/train_step.onnx",
     "a file of the input ARTIFACT_DIR|CHECKPOINT arts"),
]


@pytest.mark.parametrize("args, name, said", OWN_INPUT, ids=[" ".join(args) for args, _, _ in OWN_INPUT])
def test_an_output_naming_an_input_is_refused_and_the_input_kept(ws, capsys, monkeypatch, args, name,
                                                                 said):
    monkeypatch.chdir(ws)
    before = (ws / name).read_bytes()
    err = one_line_error(run_cli(capsys, *args))
    assert f"{said}; graphc never overwrites its input: write to another path" in err, err
    assert (ws / name).read_bytes() == before


@pytest.mark.parametrize("args, link", [
    (["inspect", "loop.onnx"], "loop.onnx"),
    (["run", "mlp.onnx", "-i", "x=loop.npy"], "loop.npy"),
    (["capture", "loop.py:Net", "-i", "x:float32[N,4]", "-o", "c.onnx"], "loop.py"),
    (["train", "loop_dir", "--data", "data.npz", "--epochs", "1", "--batch-size", "8"], "loop_dir"),
    (["export", "loop_dir", "-o", "e.onnx"], "loop_dir"),
    (["serve", "loop.onnx"], "loop.onnx"),
])
def test_an_input_that_is_a_looping_link_is_named(ws, capsys, monkeypatch, args, link):
    monkeypatch.chdir(ws)
    err = one_line_error(run_cli(capsys, *args))
    assert f": a symbolic link that loops (to {link})" in err, err


@pytest.mark.parametrize("args", [["optimize", "mlp.onnx", "-o", "loop.onnx"],
                                  ["run", "mlp.onnx", "-i", "x=x.npy", "-o", "loop.npy"],
                                  ["grad", "mlp.onnx", "--loss", "mse:logits", "-o", "loop_dir"]])
def test_an_output_that_is_a_looping_link_is_refused_and_kept(ws, capsys, monkeypatch, args):
    monkeypatch.chdir(ws)
    err = one_line_error(run_cli(capsys, *args))
    assert f"-o/--output {args[-1]}: a symbolic link that loops" in err, err
    assert os.readlink(ws / args[-1]) == args[-1]  # the link, not a file written over it
