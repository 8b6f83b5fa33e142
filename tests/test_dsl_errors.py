"""Build-time errors raise gc.GraphError naming the op, the operands and the user's line."""

from __future__ import annotations

import inspect
import json
import operator

import numpy as np
import pytest

import graphc as gc
from graphc import nn

HERE = "test_dsl_errors.py"


def _line_of(marker: str) -> int:
    """Line number in this file of the line ending with ``# <marker>``."""
    src = inspect.getsource(inspect.getmodule(_line_of)).splitlines()
    return next(i + 1 for i, line in enumerate(src) if line.rstrip().endswith(f"# {marker}"))


def test_mismatched_matmul_names_the_line():
    def f(x, w):
        return x @ w  # MATMUL

    with pytest.raises(gc.GraphError) as err:
        gc.capture(f, x=gc.spec("float32", ("N", 3)), w=gc.spec("float32", (4, 5)))
    msg = str(err.value)
    assert f"{HERE}:{_line_of('MATMUL')}" in msg
    assert "MatMul" in msg and "float32[N,3]" in msg and "float32[4,5]" in msg and "3 vs 4" in msg


def test_a_symbolic_dim_that_must_equal_a_size_is_a_capture_error():
    def f(h):
        return h @ h  # SYMBOLIC

    with pytest.raises(gc.GraphError) as err:
        gc.capture(f, h=gc.spec("float32", ("N", 32)))
    msg = str(err.value)
    assert f"{HERE}:{_line_of('SYMBOLIC')}" in msg
    assert "MatMul(float32[N,32], float32[N,32]): inner dimensions differ (32 vs N)" in msg
    assert "agree only if the dim N is 32" in msg
    # the same code with the dim static (or two dim names, which may be equal) captures
    assert gc.capture(f, h=gc.spec("float32", (32, 32))).outputs[0].shape == (32, 32)
    assert gc.capture(lambda a, b: a @ b, a=gc.spec("float32", ("N", "K")), b=gc.spec("float32", ("M", 4)))


@pytest.mark.parametrize("layer, shape, what", [
    (lambda: nn.Linear(8, 2), ("N", "F"), "input features and weight in_features differ (F vs 8)"),
    (lambda: nn.Conv2d(3, 4, 3), ("N", "C", 8, 8), "input channels and weight channels x groups=1 differ (C vs 3)"),
    (lambda: nn.BatchNorm2d(3), ("N", "C", 8, 8), "input and norm channels differ (C vs 3)"),
    (lambda: nn.LayerNorm(6), ("N", "F"), "differ (F vs 6)"),
])
def test_layers_refuse_a_dim_name_where_their_size_is_fixed(layer, shape, what):
    with pytest.raises(gc.GraphError, match=r"agree only if the dim [FC] is \d") as err:
        gc.capture(layer(), x=gc.spec("float32", shape))
    assert what in str(err.value)


def test_bad_broadcast_names_the_line():
    def f(x, y):
        return x + y  # BROADCAST

    with pytest.raises(gc.GraphError) as err:
        gc.capture(f, x=gc.spec("float32", ("N", 3)), y=gc.spec("float32", (4,)))
    msg = str(err.value)
    assert f"{HERE}:{_line_of('BROADCAST')}" in msg
    assert "Add" in msg and "float32[N,3]" in msg and "float32[4]" in msg and "broadcast" in msg


def test_wrong_dtype_mix_names_the_line():
    """A mix torch refuses too (matmul of two dtypes; elementwise ops promote as torch's)."""
    def f(x, w):
        return x @ w  # DTYPE

    with pytest.raises(gc.GraphError) as err:
        gc.capture(f, x=gc.spec("float32", ("N", 3)), w=gc.spec("float64", (3, 3)))
    msg = str(err.value)
    assert f"{HERE}:{_line_of('DTYPE')}" in msg
    assert "MatMul" in msg and "float32" in msg and "float64" in msg and "dtype" in msg


def test_error_inside_a_module_points_at_the_users_line():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(10, 2)

        def forward(self, x):
            return self.fc(x)  # MODULE

    with pytest.raises(gc.GraphError) as err:
        gc.capture(Net(), x=gc.spec("float32", ("N", 7)))
    assert f"{HERE}:{_line_of('MODULE')}" in str(err.value)
    assert "7" in str(err.value) and "10" in str(err.value)


def test_onnx_inference_errors_are_wrapped():
    def f(x):
        return gc.softmax(x, axis=5)  # INFER

    with pytest.raises(gc.GraphError) as err:
        gc.capture(f, x=gc.spec("float32", ("N", 3)))
    assert f"{HERE}:{_line_of('INFER')}" in str(err.value) and "Softmax" in str(err.value)


@pytest.mark.parametrize("fn,specs,want", [
    (lambda x: gc.nn.functional.expand(x, (2, 4)),
     {"x": ("float32", (2, 3))}, "Expand(float32[2,3], int64[2]): shapes do not broadcast (dim 3 vs 4)"),
    (lambda x, y: gc.concat([x, y], axis=0),
     {"x": ("float32", ("N", 3)), "y": ("float32", ("N", 4))}, "Concat(float32[N,3], float32[N,4]): dims differ"),
    (lambda x: gc.exp(x),
     {"x": ("int64", (4,))}, "Exp(int64[4]): input 0 has dtype int64, which Exp does not take"),
    (lambda x: gc.conv2d(x, np.ones((4, 3, 9, 9), np.float32)), {"x": ("float32", ("N", 3, 8, 8))},
     "Conv(float32[N,3,8,8], float32[4,3,9,9]): output size is too small: the window (9 wide, dilation 1) does "
     "not fit axis 2 (size 8, pads 0 and 0)"),
    (lambda x: gc.max_pool2d(x, 10), {"x": ("float32", (2, 3, 8, 8))}, "MaxPool(float32[2,3,8,8]): output size is "
     "too small: the window (10 wide, dilation 1) does not fit axis 2 (size 8, pads 0 and 0)"),
    (lambda x: gc.nn.functional.avg_pool1d(x, 4, padding=1), {"x": ("float32", (2, 3, 1))},
     "does not fit axis 2 (size 1, pads 1 and 1)"),
], ids=["expand", "concat", "dtype", "conv_window", "pool_window", "pool1d_window"])
def test_fast_inference_errors_name_op_operands_and_line(fn, specs, want):
    """Mismatches passes/infer.py's rules and schema checks find (no DSL pre-check) read like the others;
    a window wider than its padded input is refused as torch refuses it (onnx infers a size of 0
    or less, then onnxruntime fails without a line, or a MaxPool gives different shapes)."""
    with pytest.raises(gc.CaptureError) as err:
        gc.capture(fn, **{k: gc.spec(*v) for k, v in specs.items()})
    assert want in str(err.value) and f"{HERE}:{fn.__code__.co_firstlineno}" in str(err.value)


def test_eager_errors_carry_values():
    def f(x, y):
        return x + y  # EAGER

    with pytest.raises(gc.GraphError) as err:
        gc.capture(f, x=np.ones((2, 3), np.float32), y=np.zeros((2, 4), np.float32))
    msg = str(err.value)
    assert f"{HERE}:{_line_of('EAGER')}" in msg and "values" in msg and "1." in msg


def test_python_if_on_a_tensor_is_refused():
    def f(x):
        if x.sum() > 0:  # BOOL
            return x
        return -x

    with pytest.raises(gc.GraphError, match="gc.where|gc.cond") as err:
        gc.capture(f, x=gc.spec("float32", (3,)))
    assert f"{HERE}:{_line_of('BOOL')}" in str(err.value)


@pytest.mark.parametrize("fn,match", [
    (lambda x: x.reshape(5, -1), "reshape"),
    (lambda x: x[7], "out of range"),
    (lambda x: gc.where(x, x, x), "bool"),
    (lambda x: gc.conv2d(x, np.ones((2, 3, 1, 1), np.float32)), "rank-4"),
    (lambda x: gc.transpose(x, [0, 0]), "permutation"),
    (lambda x: gc.embedding(x, np.ones((3, 3), np.float32)), "int64"),
    (lambda x: gc.dropout(x, 1.5), "probability"),
], ids=["reshape", "index", "where", "conv_rank", "perm", "embedding", "dropout"])
def test_other_mistakes_raise_graph_error(fn, match):
    with pytest.raises(gc.GraphError, match=match):
        gc.capture(fn, x=gc.spec("float32", (4, 3)))


@pytest.mark.parametrize("conv, shape", [(nn.Conv1d(3, 4, 3, stride=2, padding="same"), (1, 3, 8)),
                                         (nn.Conv2d(3, 4, 3, stride=(1, 2), padding="same"), (1, 3, 8, 8)),
                                         (nn.Conv3d(3, 4, 3, stride=2, padding="same"), (1, 3, 4, 4, 4))])
def test_same_padding_needs_stride_one(conv, shape):
    """As torch refuses it (Conv2d took it, as an ``auto_pad`` onnxruntime also runs)."""
    with pytest.raises(gc.CaptureError, match=r"padding='same' needs stride 1, as in PyTorch; got stride \[") as err:
        gc.capture(conv, x=gc.spec("float32", shape))  # SAME
    assert f"{HERE}:{_line_of('SAME')}" in str(err.value)


@pytest.mark.parametrize("fn, shape, opset, want", [
    (lambda x: nn.GroupNorm(2, 4)(x), (2, 6, 4), 21,
     "GroupNormalization(float32[2,6,4], float32[4]): weight must have one entry per channel (6,), got (4,)"),
    (lambda x: nn.GroupNorm(2, 4)(x), (2, 6, 4), 18, "weight must have one entry per channel (6,), got (4,)"),
    (lambda x: gc.nn.functional.index_select(x, 0, np.array([[1, 0]])), (3, 4), 21,
     "Gather(float32[3,4], int64[1,2]): index_select takes a 1-D index, as torch, got rank 2"),
], ids=["group_norm", "group_norm_written_out", "index_select"])
def test_arguments_torch_refuses_are_refused_at_capture(fn, shape, opset, want):
    """They had captured, then failed in onnxruntime without a line (GroupNorm), or gave
    ``x[index]`` where torch raises (index_select)."""
    with pytest.raises(gc.CaptureError) as err:
        gc.capture(fn, x=gc.spec("float32", shape), opset=opset)
    assert want in str(err.value) and f"{HERE}:{fn.__code__.co_firstlineno}" in str(err.value)


def test_ops_outside_capture_and_bad_outputs():
    np.testing.assert_array_equal(np.asarray(gc.relu(np.array([-1.0, 2.0]))), [0.0, 2.0])  # evaluated, as torch's
    with pytest.raises(gc.GraphError, match="must return"):
        gc.capture(lambda x: 3, x=gc.spec("float32", (3,)))
    with pytest.raises(gc.GraphError, match="opset"):
        gc.capture(lambda x: x, x=gc.spec("float32", (3,)), opset=12)
    with pytest.raises(gc.GraphError, match="at least one input"):
        gc.capture(lambda: None)


def test_control_flow_errors():
    with pytest.raises(gc.GraphError, match="dtype"):
        gc.capture(lambda x: gc.cond(x.sum() > 0, lambda: x, lambda: x.astype("int64")), x=gc.spec("float32", (3,)))
    with pytest.raises(gc.GraphError, match="changes"):
        gc.capture(lambda x: gc.fori_loop(0, 3, lambda i, c: c.astype("int64"), x), x=gc.spec("float32", (3,)))
    with pytest.raises(gc.GraphError, match="predicate"):
        gc.capture(lambda x: gc.cond(x.sum(), lambda: x, lambda: x), x=gc.spec("float32", (3,)))


class _Typo(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 2)

    def forward(self, x):
        return self.fc3(x)  # attribute-error


def _index(x):
    return x * [1.0, 2.0][5]  # index-error


def _divide(x):
    return x * (1 / 0)  # zero-division


def _runtime(x):
    raise RuntimeError("not ready")  # runtime-error


def _in_a_library(x):
    return x * json.loads("{")  # in-a-library


def _in_control_flow(x):
    return gc.cond(x.sum() > 0, lambda: x * {}["k"], lambda: x)  # in-control-flow


@pytest.mark.parametrize("fn, kind, marker", [
    (_Typo(), AttributeError, "attribute-error"), (_index, IndexError, "index-error"),
    (_divide, ZeroDivisionError, "zero-division"), (_runtime, RuntimeError, "runtime-error"),
    (_in_a_library, json.JSONDecodeError, "in-a-library"), (_in_control_flow, KeyError, "in-control-flow"),
])
def test_an_exception_in_the_captured_code_is_a_capture_error_naming_its_line(fn, kind, marker):
    # it left gc.capture as it was raised, and `graphc capture` printed its traceback
    with pytest.raises(gc.CaptureError, match=rf"^{kind.__name__} in the captured code at \S*{HERE}:"
                                              rf"{_line_of(marker)}: ") as err:
        gc.capture(fn, x=gc.spec("float32", (3,)))
    assert type(err.value.__cause__) is kind


def _into_graphc_passes(x):
    from graphc.passes.values import static_shape
    # a tuple has no .shape: the AttributeError is raised in passes/values.py
    return static_shape(x.shape)  # into-graphc-passes


def test_an_exception_raised_in_graphcs_passes_or_backends_names_the_users_line():
    """``graphc.passes`` and ``graphc.backends`` are graphc's own code wherever they lie: an editable
    install maps them to the repository's passes/ and backends/, outside graphc/, and the error named
    passes/values.py as the user's line."""
    with pytest.raises(gc.CaptureError, match=rf"^AttributeError in the captured code at \S*{HERE}:"
                                              rf"{_line_of('into-graphc-passes')}: "):
        gc.capture(_into_graphc_passes, x=gc.spec("float32", (3,)))


def test_an_exception_with_no_user_frame_names_graphcs_innermost_line(monkeypatch):
    # a layer's own defect (the lazy instance norms once read a removed attribute) said "at <unknown>:0"
    monkeypatch.setattr(gc.nn.ReLU, "forward", operator.itemgetter(5))  # a builtin: no Python frame of the test's
    with pytest.raises(gc.CaptureError,
                       match=r"^TypeError in the captured code at \S*graphc[/\\]nn[/\\]hooks\.py:\d+: "):
        gc.capture(gc.nn.ReLU(), x=gc.spec("float32", (3,)))
