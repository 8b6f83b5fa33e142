"""The rows of the batch followed into If, Loop and Scan subgraphs (``passes/training/row_subgraphs.py``):
recurrent models written with gc.scan / gc.fori_loop / gc.while_loop, gc.cond with a condition not from
the rows, nested bodies, torch's exported LSTM/GRU and torch.cond / torch's scan exported by the dynamo
exporter (If, Scan) give no ``gc.DataParallelWarning``; a mix inside a
body is named (the inner node, its DSL line, the subgraphs it sits in), as are a condition from the batch,
a Scan along the batch axis and a carried value whose rows change axis."""

from __future__ import annotations

import re
import warnings

import onnx
import onnx_ir as ir
import pytest

import graphc as gc
from graphc import nn
from graphc.passes.training.row_mixing import mixing_nodes
from graphc.runtime.distributed.mixed_rows import warn_mixed_rows
from test_row_mixing import _found, _mse

THIS = "tests/test_row_mixing_subgraphs.py"


class _Loops(nn.Module):
    """``kind`` picks a forward over x [N, 6]; the ``*_mix`` ones mix rows inside a body."""

    def __init__(self, kind: str):
        super().__init__()
        self.emb, self.wx, self.wh, self.out = nn.Embedding(10, 6), nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)
        self.kind = kind

    def cell(self, h, x):
        return gc.tanh(self.wx(x) + self.wh(h))

    def forward(self, x, tokens):
        kind, e = self.kind, self.emb(tokens).transpose(0, 1)  # e [T, N, 6]: the scan runs over time
        if kind == "scan_lm":  # h0 zeros shaped as a step's input: not by rows, rows after one step
            h, hs = gc.scan(lambda h, xt: (self.cell(h, xt),) * 2, gc.zeros_like(e[0]), e)
            return {"out": self.out(hs.transpose(0, 1)) + self.out(h)[:, None]}
        if kind == "scan_mix":
            return {"out": self.out(gc.scan(lambda h, xt: (self.cell(h, xt) - xt.mean(0), h), x, e)[0])}
        if kind == "scan_along_batch":
            return {"out": self.out(gc.scan(lambda h, row: (self.cell(h, row), h), self.wx.bias, x)[1])}
        if kind == "fori":
            return {"out": self.out(gc.fori_loop(0, 3, lambda i, h: self.cell(h, x), x))}
        if kind == "while":
            return {"out": self.out(gc.while_loop(lambda i, h: i < 3, lambda i, h: (i + 1, self.cell(h, x)),
                                                  (gc.tensor(0), x))[1])}
        if kind == "cond":
            return {"out": self.out(gc.cond(self.wx.bias.sum() > 0, lambda: self.wx(x), lambda: x * 2.0))}
        if kind == "cond_mix":
            return {"out": self.out(gc.cond(x.sum() > 0, lambda: self.wx(x), lambda: x * 2.0))}
        if kind == "nested":
            return {"out": self.out(gc.fori_loop(0, 3, lambda i, h: gc.cond(
                i > 1, lambda: self.cell(h, x), lambda: h + 1.0), x))}
        if kind == "nested_mix":
            return {"out": self.out(gc.fori_loop(0, 3, lambda i, h: gc.cond(
                i > 1, lambda: self.cell(h, x), lambda: h - h.mean(0)), x))}
        centred = x - x.mean(0)  # "captured_mix": a mix outside read only inside the body
        return {"out": self.out(gc.fori_loop(0, 3, lambda i, h: self.cell(h, centred), x))}


def _arts(kind: str):
    model = gc.capture(_Loops(kind), seed=0, x=gc.spec("float32", ("N", 6)), tokens=gc.spec("int64", ("N", 5)))
    return _mse(model, "out")


def _line(text: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if text in line)


@pytest.mark.parametrize("kind", ["scan_lm", "fori", "while", "cond", "nested"])
def test_loops_and_conds_that_keep_rows_apart_warn_not(kind):
    assert _found(_arts(kind)) == []


# kind: (the nodes reported, the forward's line by its text, the message after the source)
MIXES = {
    "scan_mix": (["ReduceMean"], "self.cell(h, xt) - xt.mean(0)",
                 r"it reduces the batch axis 0 \(inside the body of Scan '[^']+'\)"),
    "cond_mix": (["ReduceSum"], "gc.cond(x.sum() > 0", r"it reduces every axis, the batch's included"),
    "scan_along_batch": (["Scan"], "(self.cell(h, row), h)",
                         r"it scans 'x' along its batch axis 0: each iteration sees one row"),
    "nested_mix": (["ReduceMean"], "h - h.mean(0)", (r"it reduces the batch axis 0 \(inside the else_branch of If "
                                                    r"'[^']+', inside the body of Loop '[^']+'\)")),
    "captured_mix": (["ReduceMean"], "centred = x - x.mean(0)", r"it reduces the batch axis 0"),
}


@pytest.mark.parametrize("kind", list(MIXES))
def test_a_mix_inside_a_body_is_named_with_its_line(kind):
    ops, text, why = MIXES[kind]
    arts = _arts(kind)
    assert [f.split()[0] for f in _found(arts)] == ops
    with pytest.warns(gc.DataParallelWarning, match=rf"node '[^']+' \({ops[0]}, {THIS}:{_line(text)}\): {why}"):
        warn_mixed_rows(arts.eval, arts.manifest, {"x", "tokens", "t"}, 2)


@pytest.mark.parametrize("op", ["Loop", "If"])
def test_rows_that_change_axis_through_a_body_are_its_mix(op):
    """x [N, N] transposed by each iteration (the rows on axis 0 before it and on axis 1 after), or by one
    branch of a cond on a parameter."""
    fc = nn.Linear(4, 3)

    def forward(x):
        if op == "Loop":
            h = gc.fori_loop(0, 2, lambda i, h: h.T * 2.0, x)
        else:
            h = gc.cond(fc.bias.sum() > 0, lambda: x * 2.0, lambda: x.T)
        return {"out": fc(h[:, :4])}

    arts = _mse(gc.capture(forward, seed=0, x=gc.spec("float32", ("N", "N"))), "out")
    assert [f.split()[0] for f in _found(arts)] == [op]
    what = (r"carried value '[^']+' \(before an iteration vs after it\)" if op == "Loop"
            else r"output '[^']+' \(then_branch vs else_branch\)")
    with pytest.warns(gc.DataParallelWarning, match=rf"\({op}, [^)]+\): its {what} holds the rows on axis 0 one "
                                                    r"way and the rows on axis 1 the other"):
        warn_mixed_rows(arts.eval, arts.manifest, {"x"}, 2)


@pytest.mark.parametrize("cell", ["LSTM", "GRU"])
@pytest.mark.parametrize("mix", [False, True])
def test_torch_exported_recurrent_layers(cell, mix, tmp_path):
    """torch.onnx's LSTM/GRU ops (batch_first: a Transpose to [T, N, I], layout 0) keep the rows; a
    mean over the batch after them is found."""
    torch = pytest.importorskip("torch")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn, self.fc = getattr(torch.nn, cell)(5, 4, batch_first=True), torch.nn.Linear(4, 3)

        def forward(self, x):
            y = self.rnn(x)[0]
            return self.fc(y - y.mean(0) if mix else y)

    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net(), (torch.randn(2, 7, 5),), str(path), dynamo=False, opset_version=17,
                          input_names=["x"], output_names=["out"], dynamic_axes={"x": {0: "N"}, "out": {0: "N"}})
    model = gc.load(path)
    assert cell in [n.op_type for n in model.graph]
    assert [f.split()[0] for f in _found(_mse(model, "out"))] == (["ReduceMean"] if mix else [])


def _graph(node: onnx.NodeProto, inputs: list, then: str = "out") -> ir.Graph:
    """A graph of ``node`` (output ``y``) then ``ReduceSum(y, axes=[1])`` as ``out``: the reduction
    mixes rows exactly when ``y``'s rows are on axis 1."""
    h = onnx.helper
    axes = h.make_tensor("axes", onnx.TensorProto.INT64, [1], [1])
    graph = h.make_graph([node, h.make_node("ReduceSum", ["y", "axes"], [then], keepdims=1)], "g", inputs,
                         [h.make_tensor_value_info(then, onnx.TensorProto.FLOAT, None)], [axes])
    return ir.from_proto(h.make_model(graph, opset_imports=[h.make_opsetid("", 21)])).graph


def _mixes(graph: ir.Graph, batched: dict[str, int]) -> list[str]:
    return [f"{m.node.op_type}: {m.why}" for m in mixing_nodes(graph, batched, "out")]


@pytest.mark.parametrize(("in_axis", "out_axis", "batch_axis", "want"), [
    (1, 1, 0, []),  # x [N, T, 4] scanned over T: step [N, 4]; stacked on axis 1: [N, T, 4]
    (1, 0, 0, ["ReduceSum: it reduces the batch axis 1"]),  # stacked on axis 0: [T, N, 4]
    (0, 1, 1, []),  # x [T, N, 4]: step [N, 4], stacked [N, T, 4]
    (-2, -2, 0, []),  # counted from the end: as (1, 1)
    (0, 0, 0, ["Scan: it scans 'x' along its batch axis 0: each iteration sees one row, and its carried values "
               "go from row to row"]),
])
def test_scan_axes_shift_the_batch_axis(in_axis, out_axis, batch_axis, want):
    h, f = onnx.helper, onnx.TensorProto.FLOAT
    body = h.make_graph([h.make_node("Tanh", ["xs"], ["ys"])], "body", [h.make_tensor_value_info("xs", f, [None, 4])],
                        [h.make_tensor_value_info("ys", f, [None, 4])])
    scan = h.make_node("Scan", ["x"], ["y"], body=body, num_scan_inputs=1, scan_input_axes=[in_axis],
                       scan_output_axes=[out_axis])
    graph = _graph(scan, [h.make_tensor_value_info("x", f, [None, None, 4])])
    for v in graph:  # the outer output's rank, for a negative scan output axis
        v.outputs[0].shape = ir.Shape([None, None, 4]) if v.op_type == "Scan" else v.outputs[0].shape
    assert _mixes(graph, {"x": batch_axis}) == want


@pytest.mark.parametrize("op", ["If", "Loop"])
def test_a_condition_or_trip_count_from_the_rows_mixes(op):
    """c by rows (a [N] bool; one row on each worker): each shard would choose for itself."""
    h, f = onnx.helper, onnx.TensorProto.FLOAT
    if op == "If":
        branch = h.make_graph([h.make_node("Identity", ["x"], ["b"])], "branch", [],
                              [h.make_tensor_value_info("b", f, ["N", 4])])
        node = h.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)
        c, why = h.make_tensor_value_info("c", onnx.TensorProto.BOOL, ["N"]), "its condition 'c'"
    else:
        body = h.make_graph([h.make_node("Identity", ["ci"], ["co"]), h.make_node("Neg", ["s"], ["so"])], "body",
                            [h.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
                             h.make_tensor_value_info("ci", onnx.TensorProto.BOOL, []),
                             h.make_tensor_value_info("s", f, [None, None])],
                            [h.make_tensor_value_info("co", onnx.TensorProto.BOOL, []),
                             h.make_tensor_value_info("so", f, [None, None])])
        node = h.make_node("Loop", ["c", "", "x"], ["y"], body=body)
        c, why = h.make_tensor_value_info("c", onnx.TensorProto.INT64, ["N"]), "its trip count 'c'"
    graph = _graph(node, [c, h.make_tensor_value_info("x", f, ["N", 4])])
    assert _mixes(graph, {"c": 0, "x": 0}) == [f"{op}: {why} is computed from the batch's rows: a shard may "
                                               + ("take another branch" if op == "If" else "run another number of "
                                                  "iterations") + " than the whole batch"]
    assert _mixes(graph, {"x": 0}) == []


@pytest.mark.parametrize(("kind", "found"), [("cond", []), ("scan", []), ("scan_mix", ["ReduceMean"])])
def test_torch_dynamo_exported_cond_and_scan(kind, found, tmp_path):
    """torch.cond (on an input not by rows) and torch's scan over time, exported by torch.onnx's dynamo
    exporter as ONNX If and Scan: followed inside; a batch mean in the scan's body is found."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("onnxscript")
    from torch._higher_order_ops.scan import scan

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 3)

        def step(self, h, xt):
            h = torch.tanh(self.a(xt) + h)
            return h, (h - h.mean(0) if kind == "scan_mix" else h.clone())

        def forward(self, x, f):
            if kind == "cond":
                return self.b(torch.cond(f.sum() > 0, lambda x: self.a(x[:, 0]), lambda x: x[:, 1] * 2.0, (x,)))
            return self.b(scan(self.step, torch.zeros_like(x[:, 0]), x.transpose(0, 1))[1].transpose(0, 1))

    path = tmp_path / "m.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Net(), (torch.randn(3, 5, 4), torch.ones(1)), dynamo=True, input_names=["x", "f"],
                          output_names=["out"], dynamic_shapes={"x": {0: torch.export.Dim("N")}, "f": None},
                          verbose=False).save(str(path))
    model = gc.load(path)
    assert ("If" if kind == "cond" else "Scan") in [n.op_type for n in model.graph]
    assert [f.split()[0] for f in _found(_mse(model, "out"))] == found


class _Nest(nn.Module):
    """Three gc.fori_loops nested, each step a gc.cond, each loop carrying h and a chain of three values that
    take the rows one fixed-point pass at a time (a <- h, b <- a, c <- b); ``mix``: the innermost step
    subtracts the batch's mean."""

    def __init__(self, mix: bool):
        super().__init__()
        self.fc, self.out, self.mix = nn.Linear(6, 6), nn.Linear(6, 3), mix

    def level(self, depth, h, x):
        def step(i, carry):
            h, *chain = carry
            inner = self.level(depth - 1, h, x) if depth > 1 else gc.tanh(self.fc(h) + x)
            inner = inner - h.mean(0) if self.mix and depth == 1 else inner
            return (gc.cond(i > 1, lambda: inner, lambda: h * 0.5), h, *chain[:-1])
        return gc.fori_loop(0, 2, step, (h, *(gc.zeros(1, 6) + self.fc.bias for _ in range(3))))[-1]

    def forward(self, x):
        return {"out": self.out(self.level(3, x, x))}


@pytest.mark.parametrize("mix", [False, True])
def test_nested_loops_walk_each_body_once_per_state_of_its_rows(mix, monkeypatch):
    """Each fixed-point pass over a Loop's carried values walked its body again, and with it every body
    nested in it: 253 graph walks here, growing as the passes' product over the nesting; a body is now
    walked once per state of the rows it reads (19), and what is found is the same."""
    from graphc.passes.training import row_mixing

    graph = _mse(gc.capture(_Nest(mix), seed=0, x=gc.spec("float32", ("N", 6))), "out").eval.ir.graph
    walks, walk = [], row_mixing._walk
    monkeypatch.setattr(row_mixing, "_walk", lambda *args: walks.append(args[0]) or walk(*args))
    found = mixing_nodes(graph, {"x": 0}, "out")
    assert len(walks) <= 25, len(walks)
    if not mix:
        assert found == []
        return
    assert [m.node.op_type for m in found] == ["ReduceMean"]
    assert re.fullmatch(r"it reduces the batch axis 0 \(inside the body of Loop '[^']+'(, inside the body of Loop "
                        r"'[^']+'){2}\)", found[0].why), found[0].why
