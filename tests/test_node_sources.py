"""The ``graphc.source`` each captured node records: the user's ``file.py:LINE``; for nodes the
command line makes with no user code on the way (`graphc grad`'s loss, `graphc capture` of one of
graphc's own modules) the command and option that made them, never typer's frame that called it."""

from __future__ import annotations

import inspect
import textwrap

import numpy as np
import onnx
from cli_util import run_cli
from trainer_models import imported_mlp

import graphc as gc
from graphc.model import SOURCE_KEY


def _sources(path) -> list[tuple[str, str]]:
    """(node name, its ``graphc.source``) of each node of the checked ONNX file ``path`` that has one."""
    onnx.checker.check_model(str(path), full_check=True)
    return [(node.name, prop.value) for node in onnx.load(path).graph.node
            for prop in node.metadata_props if prop.key == SOURCE_KEY]


def test_grad_loss_nodes_name_the_loss_option(capsys, tmp_path):
    onnx.save(imported_mlp(), tmp_path / "mlp.onnx")
    result = run_cli(capsys, "grad", tmp_path / "mlp.onnx", "--loss", "cross_entropy:logits:y", "-o", tmp_path / "arts")
    assert result.code == 0, result.err
    for graph in ("train_step", "gradients", "eval"):
        sources = _sources(tmp_path / "arts" / f"{graph}.onnx")
        assert any(name.startswith("loss/") for name, _ in sources), graph  # the loss and its gradient
        assert {source for _, source in sources} == {"graphc grad --loss cross_entropy:logits:y"}, graph


def test_capture_names_the_users_lines_and_the_command_for_graphcs_modules(capsys, tmp_path, monkeypatch):
    """FILE.py's own code, and an installed package's it calls, name their lines within the
    command; one of graphc's modules given as the target names the command."""
    site = tmp_path / "site-packages"
    site.mkdir()
    (site / "helpers.py").write_text("import graphc as gc\n\n\ndef doubled(x):\n    return gc.relu(x) * 2\n")
    monkeypatch.syspath_prepend(str(site))
    (tmp_path / "net.py").write_text(textwrap.dedent("""\
        from graphc import nn

        import helpers

        seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU())


        class Net(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

            def forward(self, x):
                return helpers.doubled(self.fc(x))
        """))
    monkeypatch.chdir(tmp_path)
    for target, want in (("net.py:seq", ["graphc capture net.py:seq"] * 2),
                         ("net.py:Net", ["net.py:14", *["site-packages/helpers.py:5"] * 3])):
        result = run_cli(capsys, "capture", target, "-i", "x:float32[N,4]", "-o", "m.onnx")
        assert result.code == 0, result.err
        assert [source for _, source in _sources(tmp_path / "m.onnx")] == want, target


def test_a_capture_in_a_test_file_names_its_line():
    line = inspect.currentframe().f_lineno + 1
    model = gc.capture(lambda x: gc.relu(x) + 1.0, x=np.ones((2, 3), np.float32))
    sources = {node.metadata_props[SOURCE_KEY] for node in model.ir.graph}
    assert {source.rsplit("/", 1)[-1] for source in sources} == {f"test_node_sources.py:{line}"}
