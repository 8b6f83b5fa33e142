"""Gradients of Loops. Loops whose step count the constants decide (a bag loop as torch.onnx's
dynamo exporter writes EmbeddingBag: its own exit condition, Ifs on constant offsets, rows
appended to a sequence) are unrolled: gradients (float64 central differences), training on
onnxruntime, deployment at opset 17. A Loop whose exit depends on data gets reverse-mode
gradients through a recorded tape, for any number of steps, zero included."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

import graphc as gc

D = TensorProto.DOUBLE
I64 = TensorProto.INT64
OFFSETS = [0, 2, 2, 4, 5]  # bag 1 is empty
W = np.random.default_rng(0).standard_normal((5, 3))


def _const(name, value):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value), name))


def bags_model(insert_at: int | None = None, new_axis: int = 1, dtype=D, opset: int = 18) -> onnx.ModelProto:
    """total = sum(tanh(ConcatFromSequence(bags)) * x), one row per bag of W's rows between
    consecutive OFFSETS: zeros for an empty bag, the sum of its rows for the last bag, their
    mean otherwise, each chosen by an If inside a Loop that counts bags while ``i < n_bags``.
    ``insert_at``: SequenceInsert's position (None appends)."""
    np_dtype = {D: np.float64, TensorProto.FLOAT: np.float32}[dtype]
    n_bags = len(OFFSETS) - 1
    reduce_axes = "axes0"  # an outer constant, as the dynamo exporter leaves it
    last_bag = helper.make_graph([helper.make_node("ReduceSum", ["rows", reduce_axes], ["row_sum"], keepdims=0)],
                                 "last", [], [helper.make_tensor_value_info("row_sum", dtype, None)])
    other_bag = helper.make_graph([helper.make_node("ReduceMean", ["rows", reduce_axes], ["row_mean"], keepdims=0)],
                                  "other", [], [helper.make_tensor_value_info("row_mean", dtype, None)])
    empty = helper.make_graph([helper.make_node("ConstantOfShape", ["width"], ["zeros"],
                                                value=numpy_helper.from_array(np.zeros(1, np_dtype)))],
                              "empty", [], [helper.make_tensor_value_info("zeros", dtype, None)])
    full = helper.make_graph([
        helper.make_node("Slice", ["W", "start", "end"], ["rows"]),
        helper.make_node("Equal", ["i", "last_index"], ["is_last"]),
        helper.make_node("If", ["is_last"], ["bag"], then_branch=last_bag, else_branch=other_bag),
    ], "full", [], [helper.make_tensor_value_info("bag", dtype, None)])
    insert = ["seq_in", "row"] + ([] if insert_at is None else ["position"])
    body = helper.make_graph([
        helper.make_node("Reshape", ["i", "one_d"], ["i1"]),
        helper.make_node("Add", ["i1", "one"], ["i2"]),
        helper.make_node("Slice", ["offsets", "i1", "i2"], ["start"]),
        helper.make_node("Add", ["i2", "one"], ["i3"]),
        helper.make_node("Slice", ["offsets", "i2", "i3"], ["end"]),
        helper.make_node("Equal", ["start", "end"], ["is_empty"]),
        helper.make_node("If", ["is_empty"], ["row"], then_branch=empty, else_branch=full),
        helper.make_node("SequenceInsert", insert, ["seq_out"]),
        helper.make_node("Add", ["i", "one"], ["i_next"]),
        helper.make_node("Less", ["i_next", "n_bags"], ["cond_out"]),
    ], "bags", [helper.make_tensor_value_info("iter", I64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                helper.make_tensor_sequence_value_info("seq_in", dtype, None), helper.make_tensor_value_info("i", I64, [])],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         helper.make_tensor_sequence_value_info("seq_out", dtype, None), helper.make_tensor_value_info("i_next", I64, [])])
    nodes = [
        _const("offsets", np.array(OFFSETS, np.int64)), _const("one", np.array(1, np.int64)),
        _const("one_d", np.array([1], np.int64)), _const("n_bags", np.array(n_bags, np.int64)),
        _const("last_index", np.array(n_bags - 1, np.int64)), _const("width", np.array([3], np.int64)),
        _const(reduce_axes, np.array([0], np.int64)), _const("position", np.array(insert_at or 0, np.int64)),
        _const("true", np.array(True)), _const("zero", np.array(0, np.int64)),
        helper.make_node("SequenceEmpty", [], ["seq0"], dtype=dtype),
        helper.make_node("Loop", ["", "true", "seq0", "zero"], ["bags", "count"], body=body),
        helper.make_node("ConcatFromSequence", ["bags"], ["stacked"], axis=0, new_axis=new_axis),
        helper.make_node("Tanh", ["stacked"], ["t"]), helper.make_node("Mul", ["t", "x"], ["weighted"]),
        helper.make_node("ReduceSum", ["weighted"], ["total"], keepdims=0),
    ]
    shape = [n_bags, 3] if new_axis else [n_bags * 3]
    graph = helper.make_graph(nodes, "bags", [helper.make_tensor_value_info("x", dtype, shape)],
                              [helper.make_tensor_value_info("total", dtype, [])],
                              [numpy_helper.from_array(W.astype(np_dtype), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    onnx.checker.check_model(model, full_check=True)
    return model


def _step_body(nodes: list, name: str, shape=(3,)) -> onnx.GraphProto:
    """A Loop body of ``nodes``: (iter, cond_in, v [shape] double) in, (cond_out, v_next) out."""
    return helper.make_graph(nodes, name, [helper.make_tensor_value_info("iter", I64, []),
                                           helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                                           helper.make_tensor_value_info("v", D, list(shape))],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_next", D, list(shape))])


def _expected_rows(insert_at):
    rows = []
    for b, (start, end) in enumerate(zip(OFFSETS, OFFSETS[1:])):
        row = np.zeros(3) if start == end else W[start:end].sum(0) if b == len(OFFSETS) - 2 else W[start:end].mean(0)
        if insert_at is None:
            rows.append(row)
        else:
            rows.insert(insert_at + len(rows) if insert_at < 0 else insert_at, row)
    return np.stack(rows)


@pytest.mark.parametrize("insert_at, new_axis", [(None, 1), (0, 1), (None, 0)])
def test_bag_loop_gradient_matches_central_differences(insert_at, new_axis):
    model = bags_model(insert_at, new_axis)
    x = np.random.default_rng(1).standard_normal([4, 3] if new_axis else [12])
    rows = _expected_rows(insert_at)
    assert np.isclose(gc.Session(model, backend="ort-cpu").run({"x": x})["total"],
                      np.sum(np.tanh(rows.reshape(x.shape)) * x))  # the model means what it says
    grads = gc.grad(model, "total", wrt=["W"])
    assert not {"Loop", "If", "SequenceInsert", "ConcatFromSequence"} & {n.op_type for n in grads.ir.graph}
    session = gc.Session(grads, backend="numpy")
    got = session.run({"x": x})
    np.testing.assert_allclose(got["total"], np.sum(np.tanh(rows.reshape(x.shape)) * x), rtol=1e-12)
    eps, numeric = 1e-6, np.zeros_like(W)
    for index in np.ndindex(W.shape):
        step = np.zeros_like(W)
        step[index] = eps
        numeric[index] = (session.run({"x": x, "W": W + step})["total"]
                          - session.run({"x": x, "W": W - step})["total"]) / (2 * eps)
    np.testing.assert_allclose(got["W_grad"], numeric, rtol=1e-6, atol=1e-9)
    on_ort = gc.Session(grads, backend="ort-cpu").run({"x": x})
    np.testing.assert_allclose(on_ort["W_grad"], got["W_grad"], rtol=1e-12)


def test_bag_loop_trains_and_inference_keeps_the_loop():
    model = gc.load(bags_model(dtype=TensorProto.FLOAT))
    arts = gc.training.generate(model, gc.losses.mse("total", label="target"), gc.optim.SGD(0.1))
    assert "Loop" in {n.op_type for n in arts.eval.ir.graph}
    assert "Loop" not in {n.op_type for n in arts.gradients.ir.graph}
    batch = {"x": np.ones((4, 3), np.float32), "target": np.zeros((), np.float32)}
    grads = gc.Session(arts.gradients, backend="ort-cpu").run(batch)
    np.testing.assert_allclose(grads["W_grad"], gc.Session(arts.gradients, backend="numpy").run(batch)["W_grad"],
                               rtol=1e-5, atol=1e-6)
    rows = _expected_rows(None)
    loss = np.sum(np.tanh(rows))
    dw = np.zeros_like(W)  # d(loss^2)/dW by hand: each row's tanh' times how each W row enters it
    for b, (start, end) in enumerate(zip(OFFSETS, OFFSETS[1:])):
        scale = 1.0 if b == len(OFFSETS) - 2 else 1.0 / max(end - start, 1)
        dw[start:end] += 2 * loss * (1 - np.tanh(rows[b]) ** 2) * scale
    np.testing.assert_allclose(grads["W_grad"], dw, rtol=1e-4)


def _grow_model(nested: bool = False) -> onnx.ModelProto:
    """v <- v * W while sum(v) < 20 (at most 10 steps, none when sum(x) >= 20 already), emitting
    sin(v) each step; objective = sum(v_final^2) + sum(emitted). ``nested``: an If on the data
    picks v * W (sum(v) > 4) or (v + sin(v)) * W."""
    step = [helper.make_node("Mul", ["v", "W"], ["v_next"])]
    if nested:
        then_branch = helper.make_graph([helper.make_node("Mul", ["v", "W"], ["scaled"])], "mul", [],
                                        [helper.make_tensor_value_info("scaled", D, [3])])
        else_branch = helper.make_graph([helper.make_node("Sin", ["v"], ["wave"]), helper.make_node("Add", ["v", "wave"], ["bumped"]),
                                         helper.make_node("Mul", ["bumped", "W"], ["grown"])], "bump", [],
                                        [helper.make_tensor_value_info("grown", D, [3])])
        step = [helper.make_node("ReduceSum", ["v"], ["v_total"], keepdims=0),
                helper.make_node("Greater", ["v_total", "four"], ["big"]),
                helper.make_node("If", ["big"], ["v_next"], then_branch=then_branch, else_branch=else_branch)]
    body = helper.make_graph([*step, helper.make_node("ReduceSum", ["v_next"], ["total"], keepdims=0),
                              helper.make_node("Less", ["total", "limit"], ["cond_out"]),
                              helper.make_node("Sin", ["v_next"], ["emit"])],
                             "grow", [helper.make_tensor_value_info("iter", I64, []),
                                      helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                                      helper.make_tensor_value_info("v", D, [3])],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_next", D, [3]),
                              helper.make_tensor_value_info("emit", D, [3])])
    nodes = [_const("trips", np.array(10, np.int64)), _const("limit", np.array(20.0)), _const("four", np.array(4.0)),
             helper.make_node("ReduceSum", ["x"], ["x_total"], keepdims=0),
             helper.make_node("Less", ["x_total", "limit"], ["go"]),
             helper.make_node("Loop", ["trips", "go", "x"], ["v_final", "emitted"], body=body),
             helper.make_node("ReduceSumSquare", ["v_final"], ["squares"], keepdims=0),
             helper.make_node("ReduceSum", ["emitted"], ["sines"], keepdims=0),
             helper.make_node("Add", ["squares", "sines"], ["objective"])]
    graph = helper.make_graph(nodes, "grow", [helper.make_tensor_value_info("x", D, [3])],
                              [helper.make_tensor_value_info("objective", D, [])],
                              [numpy_helper.from_array(np.array([1.5, 1.2, 1.7]), "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("x, steps", [([1.0, 2.0, 0.5], 6), ([3.0, 4.0, 5.0], 2), ([12.0, 1.0, 1.0], 1),
                                      ([30.0, 1.0, 1.0], 0)])
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("nested", [False, True], ids=["plain", "if_in_body"])
def test_loop_whose_exit_depends_on_data_gets_reverse_mode_gradients(x, steps, backend, nested):
    """The step count is known only at run time: a recording Loop stacks each step's values and
    a backward Loop walks them in reverse (an If in the body gets the If rule there); both
    inputs' gradients match central differences."""
    model = _grow_model(nested)
    x, w = np.array(x), np.array([1.5, 1.2, 1.7])
    v, taken = x.copy(), 0
    while taken < 10 and (v.sum() < 20 if taken else x.sum() < 20):
        v, taken = (v if v.sum() > 4 or not nested else v + np.sin(v)) * w, taken + 1
    assert taken == steps or nested  # each plain case takes the number of steps it is named for
    grads = gc.grad(model, "objective", wrt=["W", "x"])
    onnx.checker.check_model(grads.proto, full_check=True)
    session = gc.Session(grads, backend=backend)
    got = session.run({"x": x})
    assert np.isclose(got["objective"], gc.Session(model, backend="ort-cpu").run({"x": x})["objective"], rtol=1e-12)
    eps, eye = 1e-6, np.eye(3)
    numeric_w = [(session.run({"x": x, "W": w + eps * e})["objective"]
                  - session.run({"x": x, "W": w - eps * e})["objective"]) / (2 * eps) for e in eye]
    numeric_x = [(session.run({"x": x + eps * e})["objective"] - session.run({"x": x - eps * e})["objective"])
                 / (2 * eps) for e in eye]
    np.testing.assert_allclose(got["W_grad"], numeric_w, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(got["x_grad"], numeric_x, rtol=1e-6, atol=1e-8)


def test_loop_whose_exit_depends_on_data_trains_on_onnxruntime():
    from test_training_artifacts import train

    arts = gc.training.generate(gc.load(_grow_model()), gc.losses.mse("objective", label="target"), gc.optim.SGD(1e-7))
    assert arts.manifest.trainable == ["W"]
    batch = {"x": np.array([1.0, 2.0, 0.5]), "target": np.array(0.0)}
    on_ort, on_numpy = (gc.Session(arts.gradients, backend=b).run(batch)["W_grad"] for b in ("ort-cpu", "numpy"))
    np.testing.assert_allclose(on_ort, on_numpy, rtol=1e-12)
    losses, _ = train(arts, batch, 3)  # (more steps change how many the loop takes, and the loss jumps)
    assert losses[0] > losses[1] > losses[2]


def test_bag_loop_deploys_at_opset_17(tmp_path):
    """The body's ReduceSum reads its axes from the main graph; onnx's converter turns them into
    an attribute at opset 17 only when the constant is in the body's own graph."""
    model = gc.load(bags_model(dtype=TensorProto.FLOAT, opset=20))
    folder = gc.deploy.triton(model, tmp_path, "bags")
    served = onnx.load(str(folder / "1" / "model.onnx"))
    assert served.opset_import[0].version == 17
    onnx.checker.check_model(served, full_check=True)
    x = np.random.default_rng(2).standard_normal((4, 3)).astype(np.float32)
    got = ort.InferenceSession(served.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, gc.Session(model, backend="ort-cpu").run({"x": x})["total"], rtol=1e-6)


@pytest.mark.parametrize("x", [[0.3, 0.2, -0.1], [-0.3, 0.2, -0.1]])
def test_loop_with_an_if_on_data_in_its_body_is_differentiated(x):
    """A fixed 4-step Loop whose body picks v * W or tanh(v) by the sign of sum(v): unrolled,
    each step's If stays (its condition is data) and gets the If rule; both inputs' gradients
    match central differences, for inputs that take either branch first."""
    then_branch = helper.make_graph([helper.make_node("Mul", ["v", "W"], ["scaled"])], "then", [],
                                    [helper.make_tensor_value_info("scaled", D, [3])])
    else_branch = helper.make_graph([helper.make_node("Tanh", ["v"], ["squashed"])], "else", [],
                                    [helper.make_tensor_value_info("squashed", D, [3])])
    body = _step_body([helper.make_node("ReduceSum", ["v"], ["s"], keepdims=0),
                      helper.make_node("Greater", ["s", "zero"], ["positive"]),
                      helper.make_node("If", ["positive"], ["v_next"], then_branch=then_branch,
                                       else_branch=else_branch),
                      helper.make_node("Identity", ["cond_in"], ["cond_out"])], "step")
    nodes = [_const("trips", np.array(4, np.int64)), _const("zero", np.array(0.0)),
             helper.make_node("Loop", ["trips", "", "x"], ["v_final"], body=body),
             helper.make_node("ReduceSumSquare", ["v_final"], ["loss"], keepdims=0)]
    w = np.array([0.9, -0.4, 1.1])
    graph = helper.make_graph(nodes, "steps", [helper.make_tensor_value_info("x", D, [3])],
                              [helper.make_tensor_value_info("loss", D, [])], [numpy_helper.from_array(w, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    session = gc.Session(gc.grad(model, "loss", wrt=["W", "x"]), backend="numpy")
    x = np.array(x)
    got = session.run({"x": x})
    assert np.isclose(got["loss"], gc.Session(model, backend="ort-cpu").run({"x": x})["loss"], rtol=1e-12)
    eps, eye = 1e-6, np.eye(3)
    numeric_w = [(session.run({"x": x, "W": w + eps * e})["loss"] - session.run({"x": x, "W": w - eps * e})["loss"])
                 / (2 * eps) for e in eye]
    numeric_x = [(session.run({"x": x + eps * e})["loss"] - session.run({"x": x - eps * e})["loss"]) / (2 * eps)
                 for e in eye]
    np.testing.assert_allclose(got["W_grad"], numeric_w, rtol=1e-6, atol=1e-9)
    np.testing.assert_allclose(got["x_grad"], numeric_x, rtol=1e-6, atol=1e-9)


def _rnn_scan_model(length, in_axis: int, in_dir: int, out_axis: int, out_dir: int) -> onnx.ModelProto:
    """h <- tanh(h @ W + x_t @ U) over the scanned axis of x [T, 2, 3] (or [2, T, 3]), emitting
    2 * h each step; objective = sum(h_final^2) + sum(ys * C)."""
    body = helper.make_graph([helper.make_node("MatMul", ["h", "W"], ["hw"]), helper.make_node("MatMul", ["x_t", "U"], ["xu"]),
                              helper.make_node("Add", ["hw", "xu"], ["pre"]), helper.make_node("Tanh", ["pre"], ["h_next"]),
                              helper.make_node("Add", ["h_next", "h_next"], ["y_t"])], "cell",
                             [helper.make_tensor_value_info("h", D, [2, 4]), helper.make_tensor_value_info("x_t", D, [2, 3])],
                             [helper.make_tensor_value_info("h_next", D, [2, 4]), helper.make_tensor_value_info("y_t", D, [2, 4])])
    x_shape = [length, 2, 3] if in_axis == 0 else [2, length, 3]
    ys_shape = [length, 2, 4] if out_axis == 0 else [2, length, 4]
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 4)) * 0.5, "W"),
             numpy_helper.from_array(rng.standard_normal((3, 4)), "U"),
             numpy_helper.from_array(rng.standard_normal((2, 4)) * 0.1, "h0"),
             numpy_helper.from_array(rng.standard_normal(4), "C")]
    nodes = [helper.make_node("Scan", ["h0", "x"], ["h_final", "ys"], body=body, num_scan_inputs=1,
                              scan_input_axes=[in_axis], scan_input_directions=[in_dir],
                              scan_output_axes=[out_axis], scan_output_directions=[out_dir]),
             helper.make_node("ReduceSumSquare", ["h_final"], ["squares"], keepdims=0),
             helper.make_node("Mul", ["ys", "C"], ["weighted"]), helper.make_node("ReduceSum", ["weighted"], ["sums"], keepdims=0),
             helper.make_node("Add", ["squares", "sums"], ["objective"])]
    graph = helper.make_graph(nodes, "rnn", [helper.make_tensor_value_info("x", D, x_shape)],
                              [helper.make_tensor_value_info("objective", D, []),
                               helper.make_tensor_value_info("ys", D, ys_shape)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


@pytest.mark.parametrize("in_axis, in_dir, out_axis, out_dir", [(0, 0, 0, 0), (0, 1, 0, 0), (1, 0, 1, 1), (1, 1, 0, 1)])
def test_scan_of_a_length_known_only_at_run_time_gets_reverse_mode_gradients(in_axis, in_dir, out_axis, out_dir):
    """A symbolic sequence length: reverse mode with a tape, on numpy and onnxruntime, equal to
    the unrolled gradient of the same Scan with the length fixed, and to central differences."""
    wrt = ["W", "U", "h0", "x"]
    reverse = gc.grad(_rnn_scan_model("T", in_axis, in_dir, out_axis, out_dir), "objective", wrt=wrt)
    assert [n.op_type for n in reverse.ir.graph].count("Scan") == 2  # the taped forward and the backward
    onnx.checker.check_model(reverse.proto, full_check=True)
    for length in (1, 5):
        unrolled = gc.grad(_rnn_scan_model(length, in_axis, in_dir, out_axis, out_dir), "objective", wrt=wrt)
        assert "Loop" not in {n.op_type for n in unrolled.ir.graph}
        x = np.random.default_rng(length).standard_normal([length, 2, 3] if in_axis == 0 else [2, length, 3])
        expected = gc.Session(unrolled, backend="numpy").run({"x": x})
        for backend in ("numpy", "ort-cpu"):
            got = gc.Session(reverse, backend=backend).run({"x": x})
            for name in wrt:
                np.testing.assert_allclose(got[f"{name}_grad"], expected[f"{name}_grad"], rtol=1e-10, atol=1e-12,
                                           err_msg=f"{backend} {name} length {length}")
    session, eps = gc.Session(reverse, backend="numpy"), 1e-6
    direction = np.random.default_rng(7).standard_normal(x.shape)
    numeric = (session.run({"x": x + eps * direction})["objective"]
               - session.run({"x": x - eps * direction})["objective"]) / (2 * eps)
    np.testing.assert_allclose(np.sum(got["x_grad"] * direction), numeric, rtol=1e-6)


def test_loop_of_run_time_length_carrying_a_sequence_is_refused_by_name():
    body = helper.make_graph([helper.make_node("Mul", ["v", "W"], ["v_next"]),
                              helper.make_node("SequenceInsert", ["seq_in", "v_next"], ["seq_out"]),
                              helper.make_node("ReduceSum", ["v_next"], ["total"], keepdims=0),
                              helper.make_node("Less", ["total", "limit"], ["cond_out"])], "collect",
                             [helper.make_tensor_value_info("iter", I64, []),
                              helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v", D, [3]),
                              helper.make_tensor_sequence_value_info("seq_in", D, None)],
                             [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
                              helper.make_tensor_value_info("v_next", D, [3]),
                              helper.make_tensor_sequence_value_info("seq_out", D, None)])
    nodes = [_const("trips", np.array(10, np.int64)), _const("true", np.array(True)), _const("limit", np.array(20.0)),
             helper.make_node("SequenceEmpty", [], ["seq0"], dtype=D),
             helper.make_node("Loop", ["trips", "true", "x", "seq0"], ["v_final", "seq"], body=body),
             helper.make_node("ReduceSum", ["v_final"], ["objective"], keepdims=0)]
    graph = helper.make_graph(nodes, "collect", [helper.make_tensor_value_info("x", D, [3])],
                              [helper.make_tensor_value_info("objective", D, [])],
                              [numpy_helper.from_array(np.array([1.5, 1.2, 1.7]), "W")])
    with pytest.raises(gc.GraphError, match="known only at run time and it carries a sequence"):
        gc.grad(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), "objective", wrt=["W"])


def test_loop_of_run_time_length_whose_carried_value_grows_is_refused_by_name():
    """v <- Concat(v, v[-1:] * W) while sum(v) < 10: the tape could not stack the carried v,
    whose shape changes every step, so gc.grad says so instead of building a graph that fails."""
    body = _step_body([helper.make_node("Slice", ["v", "minus_one", "end"], ["last"]),
                      helper.make_node("Mul", ["last", "W"], ["scaled"]),
                      helper.make_node("Concat", ["v", "scaled"], ["v_next"], axis=0),
                      helper.make_node("ReduceSum", ["v_next"], ["total"], keepdims=0),
                      helper.make_node("Less", ["total", "limit"], ["cond_out"])], "grow", [None])
    nodes = [_const("minus_one", np.array([-1], np.int64)), _const("end", np.array([1 << 30], np.int64)),
             _const("limit", np.array(10.0)), _const("trips", np.array(5, np.int64)),
             helper.make_node("Loop", ["trips", "", "x"], ["v_final"], body=body, name="grow"),
             helper.make_node("ReduceSumSquare", ["v_final"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "grow", [helper.make_tensor_value_info("x", D, [1])],
                              [helper.make_tensor_value_info("loss", D, [])],
                              [numpy_helper.from_array(np.array([1.3]), "W")])
    with pytest.raises(gc.GraphError, match=r"Loop 'grow'.* carried value 'v' changes shape between iterations"):
        gc.grad(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), "loss", wrt=["W", "x"])


@pytest.mark.parametrize(("split", "keepdims"), [(3, 1), ([2, 5, 1], 1), (None, 0)])
def test_split_to_sequence_with_a_static_count_is_differentiated_as_split(split, keepdims):
    """torch.chunk through the dynamo exporter: SplitToSequence + SequenceAt at constant positions
    (and ConcatFromSequence of the same sequence) become Split outputs, so gradients flow; the
    gradient of x is each part's weight put back in place (closed form)."""
    rng = np.random.default_rng(0)
    x0 = rng.normal(size=(2, 8)).astype(np.float32)
    extra = [] if split is None else ["split"]
    inits = [] if split is None else [numpy_helper.from_array(np.array(split, np.int64), "split")]
    parts = split if isinstance(split, list) else [3, 3, 2] if split == 3 else [1] * 8
    weights = [rng.normal(size=(2, n) if keepdims else (2,)).astype(np.float32) for n in parts]
    inits += [numpy_helper.from_array(np.array(-1, np.int64), "last"), numpy_helper.from_array(np.array(0, np.int64), "first"),
              numpy_helper.from_array(weights[0], "w0"), numpy_helper.from_array(weights[-1], "w1"),
              numpy_helper.from_array(x0, "x")]
    nodes = [helper.make_node("SplitToSequence", ["x", *extra], ["seq"], axis=1, keepdims=keepdims),
             helper.make_node("SequenceAt", ["seq", "first"], ["a"]),
             helper.make_node("SequenceAt", ["seq", "last"], ["b"]),
             helper.make_node("Mul", ["a", "w0"], ["aw"]), helper.make_node("Mul", ["b", "w1"], ["bw"]),
             helper.make_node("ReduceSum", ["aw"], ["sa"], keepdims=0), helper.make_node("ReduceSum", ["bw"], ["sb"], keepdims=0),
             helper.make_node("Add", ["sa", "sb"], ["loss"])]
    graph = helper.make_graph(nodes, "chunk", [], [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]))
    got = gc.Session(gc.grad(model, "loss", wrt=["x"]), backend="numpy").run({})
    want = np.zeros_like(x0)
    ends = np.cumsum(parts)
    want[:, : ends[0]] += weights[0].reshape(2, -1)
    want[:, ends[-2]:] += weights[-1].reshape(2, -1)
    np.testing.assert_allclose(got["x_grad"], want, rtol=1e-6)
    np.testing.assert_allclose(got["loss"], (x0[:, : ends[0]] * weights[0].reshape(2, -1)).sum()
                               + (x0[:, ends[-2]:] * weights[-1].reshape(2, -1)).sum(), rtol=1e-5)


def _on_onnxruntime(model: onnx.ModelProto, output: str, fed: list[str]):
    """``feeds -> output`` of ``model`` on onnxruntime, its initializers named in ``fed`` made
    graph inputs (their values are the defaults)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    model.ir_version = 10  # what this onnxruntime reads
    for t in [t for t in model.graph.initializer if t.name in fed]:
        model.graph.input.append(helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)))
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = {i.name for i in model.graph.input}
    return lambda feeds: float(session.run([output], {k: v for k, v in feeds.items() if k in names})[0])


def _assert_gradients_match_central_differences(grads: gc.Model, loss: str, feeds: dict, wrt: list[str], reference):
    """The loss of the gradient model ``grads`` on numpy and onnxruntime equals ``reference(feeds)``,
    and each ``<wrt>_grad`` float64 central differences of ``reference`` along a random direction."""
    base = {t.name: numpy_helper.to_array(t) for t in grads.proto.graph.initializer} | feeds
    rng, eps = np.random.default_rng(3), 1e-6
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(grads, backend=backend).run(feeds)
        np.testing.assert_allclose(got[loss], reference(base), rtol=1e-10, err_msg=f"{backend} loss")
        for name in wrt:
            direction = rng.standard_normal(base[name].shape)
            numeric = (reference({**base, name: base[name] + eps * direction})
                       - reference({**base, name: base[name] - eps * direction})) / (2 * eps)
            np.testing.assert_allclose(np.sum(got[f"{name}_grad"] * direction), numeric, rtol=1e-6,
                                       err_msg=f"{backend} {name}")


@pytest.mark.parametrize("captured", [False, True], ids=["two_slots", "carried_and_captured"])
def test_reverse_mode_loop_sums_the_gradients_of_a_value_it_reads_twice(captured):
    """v <- v * W + u (u <- u / 2), or v <- v * W + x / 2, until sum(v) >= 10: x is the initial
    value of both carried slots, or carried and read by the body; both paths reach its gradient."""
    if captured:
        step = [helper.make_node("Mul", ["x", "half"], ["u"]), helper.make_node("Add", ["vw", "u"], ["v_next"])]
        carried, outs, slots = ["x"], ["v_final"], []
    else:
        step = [helper.make_node("Add", ["vw", "u"], ["v_next"]), helper.make_node("Mul", ["u", "half"], ["u_next"])]
        carried, outs, slots = ["x", "x"], ["v_final", "u_final"], ["u"]
    body = helper.make_graph(
        [helper.make_node("Mul", ["v", "W"], ["vw"]), *step, helper.make_node("ReduceSum", ["v_next"], ["s"], keepdims=0),
         helper.make_node("Less", ["s", "limit"], ["cond_out"])], "step",
        [helper.make_tensor_value_info("iter", I64, []), helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
         *[helper.make_tensor_value_info(n, D, [3]) for n in ["v", *slots]]],
        [helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
         *[helper.make_tensor_value_info(f"{n}_next", D, [3]) for n in ["v", *slots]]])
    nodes = [_const("trips", np.array(8, np.int64)), _const("limit", np.array(10.0)), _const("half", np.array(0.5)),
             helper.make_node("Loop", ["trips", "", *carried], outs, body=body),
             *[helper.make_node("ReduceSum", [o], [f"{o}_sum"], keepdims=0) for o in outs],
             helper.make_node("Sum", [f"{o}_sum" for o in outs], ["loss"])]
    graph = helper.make_graph(nodes, "fanout", [helper.make_tensor_value_info("x", D, [3])],
                              [helper.make_tensor_value_info("loss", D, [])],
                              [numpy_helper.from_array(np.array([1.5, 1.2, 1.3]), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    _assert_gradients_match_central_differences(gc.grad(model, "loss", wrt=["x", "W"]), "loss",
                                                {"x": np.array([1.0, 0.5, 0.7])}, ["x", "W"],
                                                _on_onnxruntime(model, "loss", ["W"]))


@pytest.mark.parametrize("twice", ["scanned", "carried_and_captured"])
def test_reverse_mode_scan_sums_the_gradients_of_a_value_it_reads_twice(twice):
    """h <- tanh(h * W + a_t + sin(b_t)) with xs scanned as both a and b, or h <- tanh(h * W + a_t
    + h0 / 2) with h0 also the initial h, over a length known only at run time."""
    scanned = ["xs", "xs"] if twice == "scanned" else ["xs"]
    extra = ([helper.make_node("Sin", ["b_t"], ["e"])] if twice == "scanned"
             else [helper.make_node("Mul", ["h0", "half"], ["e"])])
    body = helper.make_graph(
        [helper.make_node("Mul", ["h", "W"], ["hw"]), helper.make_node("Add", ["hw", "a_t"], ["pre"]), *extra,
         helper.make_node("Add", ["pre", "e"], ["pre2"]), helper.make_node("Tanh", ["pre2"], ["h_next"]),
         helper.make_node("Identity", ["h_next"], ["y"])], "cell",
        [helper.make_tensor_value_info(n, D, [2]) for n in ["h", "a_t", "b_t"][:1 + len(scanned)]],
        [helper.make_tensor_value_info("h_next", D, [2]), helper.make_tensor_value_info("y", D, [2])])
    nodes = [_const("half", np.array(0.5)),
             helper.make_node("Scan", ["h0", *scanned], ["h_final", "ys"], body=body, num_scan_inputs=len(scanned)),
             helper.make_node("ReduceSumSquare", ["ys"], ["squares"], keepdims=0),
             helper.make_node("ReduceSum", ["h_final"], ["last"], keepdims=0), helper.make_node("Add", ["squares", "last"], ["loss"])]
    graph = helper.make_graph(nodes, "fanout", [helper.make_tensor_value_info("xs", D, ["T", 2]),
                                                helper.make_tensor_value_info("h0", D, [2])],
                              [helper.make_tensor_value_info("loss", D, [])],
                              [numpy_helper.from_array(np.array([0.7, -0.4]), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feeds = {"xs": np.random.default_rng(0).standard_normal((4, 2)), "h0": np.array([0.2, -0.3])}
    _assert_gradients_match_central_differences(gc.grad(model, "loss", wrt=["xs", "h0", "W"]), "loss", feeds,
                                                ["xs", "h0", "W"], _on_onnxruntime(model, "loss", ["W"]))


def test_loop_whose_trip_count_is_an_input_with_a_default_runs_the_fed_count():
    """v <- v * W for M steps, M a graph input whose initializer (2) is only a default: the
    gradient graph runs the M it is fed (4), not the default."""
    body = _step_body([helper.make_node("Mul", ["v", "W"], ["v_next"]),
                      helper.make_node("Identity", ["cond_in"], ["cond_out"])], "step")
    nodes = [helper.make_node("Loop", ["M", "", "x"], ["v_final"], body=body),
             helper.make_node("ReduceSumSquare", ["v_final"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "power", [helper.make_tensor_value_info("x", D, [3]),
                                               helper.make_tensor_value_info("M", I64, [])],
                              [helper.make_tensor_value_info("loss", D, [])],
                              [numpy_helper.from_array(np.array([1.5, 1.2, 0.7]), "W"),
                               numpy_helper.from_array(np.array(2, np.int64), "M")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feeds = {"x": np.array([1.0, 2.0, 0.5]), "M": np.array(4, np.int64)}
    _assert_gradients_match_central_differences(gc.grad(model, "loss", wrt=["x", "W"]), "loss", feeds, ["x", "W"],
                                                _on_onnxruntime(model, "loss", ["W"]))


@pytest.mark.parametrize("path", ["grad", "training"])
@pytest.mark.parametrize("s", [[1.05, 1.05, 1.05], [3.0, 3.0, 3.0]])
def test_loop_whose_exit_depends_on_params_runs_as_many_steps_as_the_fed_params_take(path, s):
    """v <- v * S from V0 while sum(v) < 20: the step count depends on the params S and V0 alone,
    which the gradient graph takes as inputs, so it is not unrolled by their initial values."""
    body = _step_body([helper.make_node("Mul", ["v", "S"], ["v_next"]),
                      helper.make_node("ReduceSum", ["v_next"], ["total"], keepdims=0),
                      helper.make_node("Less", ["total", "limit"], ["cond_out"])], "grow")
    nodes = [_const("trips", np.array(50, np.int64)), _const("limit", np.array(20.0)),
             helper.make_node("Loop", ["trips", "", "V0"], ["v_final"], body=body),
             helper.make_node("Mul", ["v_final", "x"], ["vx"]),
             helper.make_node("ReduceSumSquare", ["vx"], ["objective"], keepdims=0)]
    graph = helper.make_graph(nodes, "grow", [helper.make_tensor_value_info("x", D, [3])],
                              [helper.make_tensor_value_info("objective", D, [])],
                              [numpy_helper.from_array(np.array([1.5, 1.2, 1.7]), "S"),
                               numpy_helper.from_array(np.array([1.0, 2.0, 0.5]), "V0")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feeds, objective = {"x": np.array([1.0, 0.5, 2.0]), "S": np.array(s)}, _on_onnxruntime(model, "objective", ["S", "V0"])
    if path == "grad":
        grads, loss, reference = gc.grad(model, "objective", wrt=["S", "V0"]), "objective", objective
    else:  # mse against 0: objective^2
        arts = gc.training.generate(gc.load(model), gc.losses.mse("objective", label="target"), gc.optim.SGD(1e-3))
        grads, loss, reference = arts.gradients, "loss", lambda f: objective(f) ** 2
        feeds["target"] = np.array(0.0)
    _assert_gradients_match_central_differences(grads, loss, feeds, ["S", "V0"], reference)


@pytest.mark.parametrize("taken", [True, False], ids=["then", "else"])
@pytest.mark.parametrize("else_op", ["Mul", "Expand", "Concat"])
def test_if_whose_branches_output_different_shapes_differentiates_either_branch(else_op, taken):
    """The then branch outputs W * x [3], the else branch a [2, 3] built from W (broadcast Mul,
    Expand, Concat); the If output's gradient takes the shape of the branch that runs, so
    onnxruntime runs either one."""
    made = {"Mul": [helper.make_node("Unsqueeze", ["W", "axis0"], ["wide"]), helper.make_node("Mul", ["wide", "X2"], ["e"])],
            "Expand": [helper.make_node("Expand", ["W", "shape"], ["e"])],
            "Concat": [helper.make_node("Unsqueeze", ["W", "axis0"], ["wide"]),
                       helper.make_node("Concat", ["wide", "wide"], ["e"], axis=0)]}[else_op]
    then_branch = helper.make_graph([helper.make_node("Mul", ["W", "x"], ["t"])], "then", [],
                                    [helper.make_tensor_value_info("t", D, [3])])
    else_branch = helper.make_graph(made, "else", [], [helper.make_tensor_value_info("e", D, [2, 3])])
    nodes = [_const("axis0", np.array([0], np.int64)), _const("shape", np.array([2, 3], np.int64)),
             helper.make_node("If", ["p"], ["o"], then_branch=then_branch, else_branch=else_branch),
             helper.make_node("Mul", ["o", "X2"], ["weighted"]), helper.make_node("ReduceSumSquare", ["weighted"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("x", D, [3]),
                                                  helper.make_tensor_value_info("X2", D, [2, 3]),
                                                  helper.make_tensor_value_info("p", TensorProto.BOOL, [])],
                              [helper.make_tensor_value_info("loss", D, [])],
                              [numpy_helper.from_array(np.array([0.5, -1.0, 2.0]), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    feeds = {"x": np.array([0.3, -0.6, 0.9]), "X2": np.array([[0.1, 0.2, 0.3], [-0.4, 0.5, 0.6]]), "p": np.array(taken)}
    _assert_gradients_match_central_differences(gc.grad(model, "loss", wrt=["W", "X2"]), "loss", feeds, ["W", "X2"],
                                                _on_onnxruntime(model, "loss", ["W"]))


@pytest.mark.parametrize("in_axis, in_dir, out_axis, out_dir", [(0, 0, 0, 0), (0, 1, 0, 0), (1, 0, 1, 1), (1, 1, 0, 1)])
def test_scan_of_no_steps_and_its_gradients(in_axis, in_dir, out_axis, out_dir):
    """A run-time length of 0: the final state is the initial one and ys is empty (ONNX), so
    objective = sum(h0^2): its gradient is 2 h0 for h0, zeros for W and U, and x's is empty."""
    model = _rnn_scan_model("T", in_axis, in_dir, out_axis, out_dir)
    h0 = next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == "h0")
    reverse = gc.grad(model, "objective", wrt=["W", "U", "h0", "x"])
    x = np.zeros([0, 2, 3] if in_axis == 0 else [2, 0, 3])
    for backend in ("numpy", "ort-cpu"):
        for got in (gc.Session(model, backend=backend).run({"x": x}), gc.Session(reverse, backend=backend).run({"x": x})):
            np.testing.assert_allclose(got["objective"], np.sum(h0 ** 2), rtol=1e-12, err_msg=backend)
            assert got["ys"].shape == ((0, 2, 4) if out_axis == 0 else (2, 0, 4)), backend
        np.testing.assert_allclose(got["h0_grad"], 2 * h0, rtol=1e-12, err_msg=backend)
        assert not got["W_grad"].any() and not got["U_grad"].any(), backend
        assert got["x_grad"].shape == x.shape, backend
