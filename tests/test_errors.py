"""Error families (issue 13, item 6): each failure has its class under ``gc.GraphcError``, the ones
users caught as ``gc.GraphError`` still are, and a message that points at a folder points at one
that exists."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx_ir as ir
import pytest
from onnx import TensorProto, helper

import graphc as gc
from graphc.backends.numpy import NumpyBackend
from graphc.passes.optimize import PipelineError as PipelineErrorFromPasses

try:
    from test_autodiff_models import mlp_model
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_models import mlp_model


def test_families_sit_under_graph_error_and_graphc_error():
    for cls in (gc.CaptureError, gc.PassError, gc.PipelineError, gc.AutodiffError, gc.MissingGradientRule,
                gc.MissingKernel):
        assert issubclass(cls, gc.GraphError) and issubclass(cls, gc.GraphcError)
    assert issubclass(gc.PipelineError, RuntimeError)  # what it was before it joined the hierarchy
    assert issubclass(gc.MissingGradientRule, gc.AutodiffError) and issubclass(gc.AutodiffError, gc.PassError)
    assert PipelineErrorFromPasses is gc.PipelineError


def test_capture_mistake_is_a_capture_error_naming_the_line():
    def f(x, y):
        return x @ y  # two dtypes: torch refuses matmul's mix too (elementwise ops promote)

    with pytest.raises(gc.CaptureError, match=r"test_errors\.py:\d+"):
        gc.capture(f, x=gc.spec("float32", (2, 3)), y=gc.spec("float64", (3, 2)))


def _path_in(message: str) -> Path:
    found = re.search(r"(/\S+?)/?(?:rules_\*\.py)? \(docs/adding-an-op\.md\)", message)
    assert found, message
    return Path(found.group(1))


def test_missing_gradient_rule_is_its_own_class_and_points_at_the_rule_files():
    proto = mlp_model()
    relu = next(n for n in proto.graph.node if n.name == "relu")
    relu.op_type = "EyeLike"  # no rule, no function body to go through, and the shape Relu had
    with pytest.raises(gc.MissingGradientRule, match="no gradient rule for ONNX op 'EyeLike'") as info:
        gc.grad(gc.load(proto), "loss")
    folder = _path_in(str(info.value))
    assert folder.is_dir() and sorted(folder.glob("rules_*.py")), folder


def test_missing_numpy_kernel_is_its_own_class_and_points_at_the_kernel_files():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("MaxRoiPool", ["x", "x"], ["y"], name="roi", pooled_shape=[2, 2])
    model = helper.make_model(helper.make_graph([node], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 21)])
    with pytest.raises(gc.MissingKernel, match=r"'MaxRoiPool'.*'roi'") as info:
        NumpyBackend().prepare(model)
    folder = _path_in(str(info.value))
    assert (folder / "kernels.py").is_file() and (folder / "elementwise.py").is_file()


def test_unknown_dtype_is_an_error_not_float32():
    t = gc.Tensor(ir.Value(name="mystery"))
    with pytest.raises(gc.CaptureError, match="dtype of mystery is unknown"):
        _ = t.dtype
    assert t.type_str() == "?[?]"
    known = gc.Tensor(ir.Value(name="k", type=ir.TensorType(ir.DataType.INT64), shape=ir.Shape(["N", 2])))
    assert known.dtype == "int64" and known.type_str() == "int64[N,2]"


def test_one_type_format_for_specs_tensors_and_feeds():
    from graphc.model.dtypes import type_text

    assert type_text("float32", ("N", None, 3)) == "float32[N,?,3]" == str(gc.spec("float32", ("N", None, 3)))
    assert type_text(None, None) == "?[?]"
    session = gc.Session(gc.capture(lambda x: gc.relu(x), x=gc.spec("float32", ("N", 3))), backend="numpy")
    with pytest.raises(gc.InputError, match=re.escape("got int64[2,3]")):
        session.run({"x": np.zeros((2, 3), np.int64)})


def test_no_module_shadows_the_standard_library():
    import sys

    package = Path(gc.__file__).parent
    shadowing = sorted(p.stem for p in package.glob("*.py") if p.stem in sys.stdlib_module_names)
    assert shadowing == []
    from graphc.model.inspection import op_histogram  # the module's new name

    assert callable(op_histogram)
