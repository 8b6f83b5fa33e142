"""The README's example runs as written from any working directory and writes only into out/."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_example_runs_in_an_empty_directory(tmp_path, monkeypatch, capsys):
    block = re.search(r"```python\n(.*?)```", README.read_text(), re.S).group(1)
    monkeypatch.chdir(tmp_path)
    exec(compile(block, str(README), "exec"), {"__name__": "readme_example"})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert {p.name for p in (tmp_path / "out").iterdir()} == {"net.onnx", "digits.onnx", "model_repo"}
    assert (tmp_path / "out" / "model_repo" / "digits" / "config.pbtxt").is_file()
    assert "accuracy" in capsys.readouterr().out


def test_readme_shell_walkthrough_runs_in_an_empty_directory(tmp_path, monkeypatch, capsys):
    """The "End to end from the shell" block, every graphc line but `serve` (the tests of
    serving run servers), with the README's own Net as net.py."""
    import shlex
    import subprocess
    import sys

    from cli_util import run_cli

    text = README.read_text()
    block = re.search(r"End to end from the shell.*?```\n(.*?)```", text, re.S).group(1)
    net = re.search(r"^class Net\(nn.Module\):\n(?:(?:    .*)?\n)+", text, re.M).group(0)
    (tmp_path / "net.py").write_text("import graphc as gc\nfrom graphc import nn\n\n" + net)
    monkeypatch.chdir(tmp_path)
    ran = []
    for line in block.splitlines():
        words = shlex.split(line, comments=True)
        if words[0] == "python":
            subprocess.run([sys.executable, *words[1:]], check=True, timeout=120)
        elif words[0] == "graphc" and words[1] != "serve":
            result = run_cli(capsys, *words[1:])
            assert result.code == 0, (line, result.err)
            ran.append(words[1])
    assert ran == ["capture", "grad", "train", "view", "export", "deploy"]
    assert (tmp_path / "repo" / "digits" / "1" / "model.onnx").is_file() and (tmp_path / "runs").is_dir()
    assert len((tmp_path / "history.csv").read_text().splitlines()) == 1 + 5
