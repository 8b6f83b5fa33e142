"""Every command's `--help` ends with an example, and the examples run: in the order a user
follows them (capture, inspect, optimize, grad, train, export, run, parity, view, deploy), each in
the folder the previous ones wrote to, with `net.py`, `data.npz` and `x.npy` the examples name."""

import numpy as np

from cli_util import run_cli

RNG = np.random.default_rng(0)

COMMANDS = ["capture", "inspect", "optimize", "grad", "train", "export", "run", "parity", "view", "deploy triton",
            "serve"]
NOT_RUN = {"serve"}  # it serves until Ctrl-C

NET_64 = ("from graphc import nn\n\n\nclass Net(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
          "        self.fc = nn.Linear(64, 10)\n\n    def forward(self, x):\n        return self.fc(x)\n")


def examples(capsys, command: str) -> list[list[str]]:
    """The `graphc ...` lines after `Example` in `graphc COMMAND --help`, as argument lists."""
    result = run_cli(capsys, *command.split(), "--help")
    assert result.code == 0, result.err
    _, _, after = result.out.partition("Example")
    return [line.split()[1:] for line in after.splitlines() if line.strip().startswith("graphc ")]


def test_every_command_help_has_an_example_that_runs(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "net.py").write_text(NET_64)
    np.savez(tmp_path / "data.npz", x=RNG.standard_normal((64, 64)).astype(np.float32),
             y=RNG.integers(0, 10, 64))
    np.save(tmp_path / "x.npy", RNG.standard_normal((3, 64)).astype(np.float32))
    for command in COMMANDS:
        found = examples(capsys, command)
        assert found, f"graphc {command} --help shows no example"
        for args in found:
            assert args[:len(command.split())] == command.split(), (command, args)
            if command not in NOT_RUN:
                result = run_cli(capsys, *args)
                assert result.code == 0, (args, result.err)
    assert {"net.onnx", "net.opt.onnx", "arts", "ck", "trained.onnx", "out.npz", "net.svg", "repo"} <= {
        path.name for path in tmp_path.iterdir()}
