"""The dtypes the node emitter records agree with onnx's own type inference.

Autodiff decides what is differentiable from these records, so a wrong one silently drops a
gradient (a float ConstantOfShape recorded as int64 once cut the gradient of everything added
to it)."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from graphc.passes.emit import Emitter


@pytest.mark.parametrize("dtype", [ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16])
def test_recorded_dtypes_match_onnx_inference(dtype):
    x = ir.Value(name="x", type=ir.TensorType(dtype), shape=ir.Shape(["N", 4]))
    graph = ir.Graph([x], [], nodes=[], name="g", opset_imports={"": 21})
    e = Emitter(graph, 21)
    shape = e.op("Shape", x)
    recorded = [
        shape, e.op("Size", x), e.op("NonZero", x), e.op("ArgMax", x, axis=1), e.op("ArgMin", x, axis=0),
        e.op("ConstantOfShape", shape, value=ir.tensor(np.zeros(1, dtype=dtype.numpy()))),
        e.op("ConstantOfShape", shape), e.op("ConstantOfShape", shape, value=ir.tensor(np.ones(1, np.int32))),
        e.op("Cast", x, to=ir.DataType.INT8), e.op("CastLike", x, shape),
        e.op("OneHot", shape, e.ints([3]), e.const(np.array([0.0, 1.0], dtype.numpy()))),
        e.op("Less", x, e.scalar(0.5, x)), e.op("Where", e.op("IsNaN", x), x, x), e.op("Relu", x),
        e.op("MatMul", x, e.op("Transpose", x, perm=[1, 0])), e.reduce("ReduceSum", x, [1], keepdims=0),
        *e.split(x, [1, 3], axis=1, count=2),
    ]
    graph.outputs.extend(recorded)
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=10))
    inferred = onnx.shape_inference.infer_shapes(proto, strict_mode=True)
    types = {o.name: o.type.tensor_type.elem_type for o in inferred.graph.output}
    for value in recorded:
        assert value.dtype is not None, value.name
        assert types[value.name] == value.dtype.value, (value.name, value.dtype, types[value.name])



def test_emitters_of_one_scope_name_their_nodes_apart():
    """Every new node and value name is one the graph does not have yet, node names included:
    two Emitters of one scope on one graph (a pass run twice, two unnamed LSTMs unrolled) once
    named two Identity nodes alike."""
    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2]))
    graph = ir.Graph([x], [], nodes=[], name="g", opset_imports={"": 21})
    outs = [Emitter(graph, 21, "out").op("Identity", x, name=f"y{i}") for i in range(3)]
    graph.outputs.extend(outs)
    names = [node.name for node in graph] + [v.name for v in graph.outputs]
    assert len(names) == len(set(names)), names
    onnx.checker.check_model(ir.serde.serialize_model(ir.Model(graph, ir_version=10)), full_check=True)


@pytest.mark.parametrize("op_type", ["ReduceSum", "ReduceMean", "ReduceMax"])
@pytest.mark.parametrize("empty_is_noop", [True, False])
def test_reduce_over_run_time_axes_that_come_out_empty(op_type, empty_is_noop):
    """``Emitter.reduce`` over axes known only at run time: empty ones give ``x`` itself, as a
    static ``[]`` does, or with ``empty_is_noop=False`` the reduction over all axes (ONNX's
    default, ``noop_with_empty_axes=0``); non-empty ones reduce over them. On onnxruntime against
    numpy."""
    import onnxruntime as ort

    x = ir.Value(name="x", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape([2, 3]))
    axes = ir.Value(name="axes", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["K"]))
    graph = ir.Graph([x, axes], [], nodes=[], name="g", opset_imports={"": 21})
    flag = {} if empty_is_noop else {"empty_is_noop": False}  # the default: x itself
    y = Emitter(graph, 21).reduce(op_type, x, axes, keepdims=True, **flag)
    y.shape = ir.Shape([None, None])  # keepdims: rank 2, dims known at run time
    graph.outputs.append(y)
    proto = ir.serde.serialize_model(ir.Model(graph, ir_version=10))
    onnx.checker.check_model(proto, full_check=True)
    session = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    xs = np.random.default_rng(0).normal(size=(2, 3)).astype(np.float32)
    fn = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max}[op_type]
    for over in ([], [1], [0, 1]):
        want = xs if not over and empty_is_noop else fn(xs, axis=tuple(over) or None, keepdims=True)
        got, = session.run(None, {"x": xs, "axes": np.array(over, np.int64)})
        np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=str(over))
