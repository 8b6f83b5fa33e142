"""`graphc view` (issue 15, item 6): an SVG/HTML picture whose gradient nodes name their
forward node; read back with an XML parser."""

from __future__ import annotations

import sys
import xml.etree.ElementTree as ET

import onnx


from cli_util import one_line_error, run_cli, workspace

SVG = "{http://www.w3.org/2000/svg}"


def _groups(svg_text: str) -> list[tuple[str, str, list[str]]]:
    """(class, tooltip, texts) of every node drawn."""
    root = ET.fromstring(svg_text)
    return [(g.get("class"), g.find(f"{SVG}title").text, [t.text for t in g.findall(f"{SVG}text")])
            for g in root.iter(f"{SVG}g")]


def test_forward_graph_svg(capsys, tmp_path):
    root = workspace(tmp_path)
    r = run_cli(capsys, "view", root / "mlp.onnx", "-o", root / "mlp.svg")
    assert r.code == 0, r.err
    groups = _groups((root / "mlp.svg").read_text())
    model = onnx.load(root / "mlp.onnx")
    assert sorted(t[0] for c, _, t in groups if c == "forward") == sorted(n.op_type for n in model.graph.node)
    assert [(c, t[0], t[1]) for c, _, t in groups if c in ("input", "output")] == [
        ("input", "x", "float32[batch, 8]"), ("output", "logits", "float32[batch, 3]")]
    assert not any(c == "gradient" for c, _, _ in groups)


def test_training_graph_marks_gradient_nodes_with_their_forward_node(capsys, tmp_path):
    root = workspace(tmp_path)
    r = run_cli(capsys, "view", root / "arts" / "train_step.onnx", "--out", root / "step.html")
    assert r.code == 0, r.err
    page = (root / "step.html").read_text()
    assert page.startswith("<!DOCTYPE html>") and "gradient node" in page
    groups = _groups(page[page.index("<svg"):page.index("</svg>") + 6])
    forward_names = {n.name for n in onnx.load(root / "arts" / "train_step.onnx").graph.node if "/grad/" not in n.name}
    grads = [(tip, texts) for c, tip, texts in groups if c == "gradient"]
    assert grads and {c for c, _, _ in groups} >= {"forward", "loss", "gradient", "optimizer"}
    named = [(tip, texts) for tip, texts in grads if "gradient of forward node" in tip]
    assert named
    for tip, texts in named:
        origin = tip.split("gradient of forward node ")[1].splitlines()[0]
        assert origin in forward_names  # the forward node exists in the same graph
        assert texts[1].startswith("∇ ") and origin.startswith(texts[1][2:].rstrip("…"))
    assert any("gradient of forward node enc" in tip for tip, _ in named)  # the Gemm named "enc" above


def test_default_without_netron_writes_html_here(capsys, tmp_path, monkeypatch):
    root = workspace(tmp_path)
    monkeypatch.setitem(sys.modules, "netron", None)
    monkeypatch.chdir(tmp_path)
    r = run_cli(capsys, "view", root / "mlp.onnx")
    assert r.code == 0, r.err
    assert (tmp_path / "mlp.html").is_file()


def test_bad_suffix_and_missing_model_are_one_line(capsys, tmp_path):
    root = workspace(tmp_path)
    err = one_line_error(run_cli(capsys, "view", root / "mlp.onnx", "-o", root / "mlp.png"))
    assert "writes .svg or .html" in err and not (root / "mlp.png").exists()
    assert "no such model file" in one_line_error(run_cli(capsys, "view", root / "none.onnx", "-o", root / "x.svg"))
    # a folder was "not 'a file without a suffix'"
    err = one_line_error(run_cli(capsys, "view", root / "mlp.onnx", "-o", root / "arts"))
    assert (f"-o/--output {root / 'arts'}: a folder, not a file; expected a file path such as "
            f"{root / 'arts' / 'graph.svg'}") in err


def test_default_with_netron_installed_opens_it(capsys, tmp_path, monkeypatch):
    import types

    calls = []
    fake = types.SimpleNamespace(start=lambda path: calls.append(("start", path)), wait=lambda: calls.append(("wait",)))
    root = workspace(tmp_path)
    monkeypatch.setitem(sys.modules, "netron", fake)
    monkeypatch.chdir(tmp_path)
    r = run_cli(capsys, "view", root / "mlp.onnx")
    assert r.code == 0, r.err
    assert calls == [("start", str(root / "mlp.onnx")), ("wait",)] and "netron" in r.out
    assert not (tmp_path / "mlp.html").exists()
