"""Unrolled gradients of Scans and Loops that read their input one step at a time: the steps
read it off one Split, so its gradient is one Concat of the steps' slices, not a scatter into
zeros of the whole input per step (quadratic in the length); the gradients equal
torch.autograd's in float64 on numpy and onnxruntime."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc as gc

D = TensorProto.DOUBLE
# ops that a per-step read of the whole input (Gather) and its gradient (zeros, a scatter) add
PER_STEP_READS = ("Gather", "ScatterElements", "ScatterND", "ConstantOfShape")


def _scan_model(length: int, second: str) -> gc.Model:
    """h <- tanh(h @ W + a_t + sin(b_t)) with a_t = x[t] and b_t the second scanned input read
    backwards (z [2, T, 3] along axis 1, or x itself), emitting 2 h stacked backwards along
    axis 1; loss = sum(h_T^2) + sum(ys * C)."""
    body = helper.make_graph(
        [helper.make_node("MatMul", ["h", "W"], ["hw"]), helper.make_node("Add", ["hw", "a_t"], ["pre"]),
         helper.make_node("Sin", ["b_t"], ["sb"]), helper.make_node("Add", ["pre", "sb"], ["pre2"]),
         helper.make_node("Tanh", ["pre2"], ["h_next"]), helper.make_node("Add", ["h_next", "h_next"], ["y_t"])],
        "cell", [helper.make_tensor_value_info(n, D, [2, 3]) for n in ("h", "a_t", "b_t")],
        [helper.make_tensor_value_info(n, D, [2, 3]) for n in ("h_next", "y_t")])
    axis = 1 if second == "z" else 0
    nodes = [helper.make_node("Scan", ["h0", "x", second], ["h_final", "ys"], body=body, num_scan_inputs=2,
                              scan_input_axes=[0, axis], scan_input_directions=[0, 1],
                              scan_output_axes=[1], scan_output_directions=[1]),
             helper.make_node("ReduceSumSquare", ["h_final"], ["squares"], keepdims=0),
             helper.make_node("Mul", ["ys", "C"], ["weighted"]),
             helper.make_node("ReduceSum", ["weighted"], ["sums"], keepdims=0),
             helper.make_node("Add", ["squares", "sums"], ["loss"])]
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((3, 3)) * 0.5, "W"),
             numpy_helper.from_array(rng.standard_normal((2, 3)) * 0.1, "h0"),
             numpy_helper.from_array(rng.standard_normal((2, length, 3)), "C")]
    inputs = [helper.make_tensor_value_info("x", D, [length, 2, 3])]
    if second == "z":
        inputs.append(helper.make_tensor_value_info("z", D, [2, length, 3]))
    graph = helper.make_graph(nodes, "scan", inputs, [helper.make_tensor_value_info("loss", D, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    wrt = ["x", "W", "h0", *(["z"] if second == "z" else [])]
    return gc.grad(model, "loss", wrt=wrt)


def _scan_reference(torch, feeds: dict, model: gc.Model, second: str):
    """(loss, its torch.autograd gradients) of ``_scan_model``'s recurrence."""
    consts = {t.name: numpy_helper.to_array(t) for t in model.proto.graph.initializer}
    leaves = {k: torch.tensor(v, requires_grad=True) for k, v in {**feeds, **consts}.items() if k != "C"}
    x, w, h = leaves["x"], leaves["W"], leaves["h0"]
    length = x.shape[0]
    ys = []
    for t in range(length):
        b_t = leaves["z"][:, length - 1 - t] if second == "z" else x[length - 1 - t]
        h = torch.tanh(h @ w + x[t] + torch.sin(b_t))
        ys.append(2 * h)
    stacked = torch.stack(ys[::-1], dim=1)
    loss = (h ** 2).sum() + (stacked * torch.tensor(consts["C"])).sum()
    loss.backward()
    return loss.item(), {k: v.grad.numpy() for k, v in leaves.items()}


def _loop_model(length: int) -> gc.Model:
    """h <- tanh(h @ w + x[i] * x[T-1-i]) over i < T by gc.fori_loop; loss = sum(h_T * c)."""
    def f(x, w, c):
        h = gc.fori_loop(0, length, lambda i, h: gc.tanh(gc.matmul(h, w) + x[i] * x[length - 1 - i]),
                         gc.zeros_like(x[0]))
        return {"loss": gc.sum(h * c)}

    rng = np.random.default_rng(2)
    return gc.grad(gc.capture(f, x=rng.standard_normal((length, 2, 3)), w=rng.standard_normal((3, 3)) * 0.5,
                              c=rng.standard_normal((2, 3))), "loss", wrt=["x", "w"])


def _loop_reference(torch, feeds: dict):
    x, w = (torch.tensor(feeds[k], requires_grad=True) for k in ("x", "w"))
    h = torch.zeros(2, 3, dtype=torch.float64)
    for i in range(x.shape[0]):
        h = torch.tanh(h @ w + x[i] * x[x.shape[0] - 1 - i])
    loss = (h * torch.from_numpy(feeds["c"])).sum()
    loss.backward()
    return loss.item(), {"x": x.grad.numpy(), "w": w.grad.numpy()}


def _ops(model: gc.Model) -> Counter:
    return Counter(n.op_type for n in model.proto.graph.node if n.op_type in PER_STEP_READS)


@pytest.mark.parametrize("case", ["scan_x_and_z", "scan_x_twice", "fori_loop"])
def test_unrolled_gradient_reads_each_step_off_one_split_and_matches_torch(case):
    """At 6 and 12 steps the gradient graph holds the same Gathers and zeros (none per step) and
    no scatter; its loss and gradients equal torch.autograd's (float64, numpy and ort-cpu)."""
    torch = pytest.importorskip("torch")
    second = {"scan_x_and_z": "z", "scan_x_twice": "x"}.get(case)
    build = (lambda n: _scan_model(n, second)) if second else _loop_model
    short, long = build(6), build(12)
    loops = [n.op_type for n in long.proto.graph.node].count("Loop")
    assert loops == (0 if second else 1), loops  # the gradient unrolled (a fori_loop's forward Loop stays)
    assert _ops(short) == _ops(long), (_ops(short), _ops(long))
    assert not _ops(long)["ScatterElements"] and not _ops(long)["ScatterND"]
    rng = np.random.default_rng(3)
    if second:
        feeds = {"x": rng.standard_normal((12, 2, 3)), **({"z": rng.standard_normal((2, 12, 3))} if second == "z" else {})}
        loss, want = _scan_reference(torch, feeds, long, second)
    else:
        feeds = {"x": rng.standard_normal((12, 2, 3)), "c": rng.standard_normal((2, 3)),
                 "w": rng.standard_normal((3, 3)) * 0.5}
        loss, want = _loop_reference(torch, feeds)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(long, backend=backend).run(feeds)
        np.testing.assert_allclose(got["loss"], loss, rtol=1e-12, err_msg=backend)
        for name in want:
            np.testing.assert_allclose(got[f"{name}_grad"], want[name], rtol=1e-10, atol=1e-12,
                                       err_msg=f"{backend} {name}")
