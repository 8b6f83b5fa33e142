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
