"""float16 and bfloat16 deployments on Triton's CPU instances: the file written runs, as it is, on
onnxruntime's CPU provider (what Triton's onnxruntime backend gets) and gives graphc's and torch's
numbers: each node the provider has no narrow kernel for is computed in float32 between Casts in
the file itself. Before, a bfloat16 file did not load ("Could not find an implementation for
Mul(14)") and a float16 one computed its runs of nodes in float32 (x * x for x = 300 came back
finite, 90000, where float16 overflows to inf)."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import graphc as gc
from graphc import nn

torch = pytest.importorskip("torch")

X = np.array([[300.0, 1.0, -2.0, 3.0], [0.5, -1.5, 2.5, 0.25]], np.float32)  # 300 ** 2 overflows float16


class _Squares(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        return {"y": self.fc(x * x) / 1000.0}


def _torch(model: gc.Model, dtype: str) -> np.ndarray:
    """The model's function in torch at ``dtype`` on the CPU, float32 in and out as deployed."""
    dt = getattr(torch, dtype)
    w, b = (torch.from_numpy(np.asarray(model.params[f"fc.{k}"])).to(dt) for k in ("weight", "bias"))
    x = torch.from_numpy(X).to(dt)
    return (torch.nn.functional.linear(x * x, w, b) / 1000.0).float().numpy()


def _deployed(tmp_path, dtype: str, instance: str = "cpu") -> tuple[gc.Model, onnx.ModelProto, str]:
    model = gc.capture(_Squares(), seed=0, x=gc.spec("float32", ("N", 4)))
    file = str(gc.deploy.triton(model, tmp_path, "m", dtype=dtype, instance=instance) / "1" / "model.onnx")
    return model, onnx.load(file), file


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_cpu_deployments_run_on_onnxruntime_as_written_with_torchs_numbers(tmp_path, dtype):
    model, proto, file = _deployed(tmp_path, dtype)
    onnx.checker.check_model(file, full_check=True)
    assert (proto.opset_import[0].version, proto.ir_version) == (17, 8)
    raw = ort.InferenceSession(file, providers=["CPUExecutionProvider"]).run(None, {"x": X})[0]
    expected = _torch(model, dtype)
    assert np.isinf(expected[0]).all() == (dtype == "float16")  # the float16 product overflows
    numpy = gc.Session(file, backend="numpy").run({"x": X})["y"]
    for got in (raw, numpy):
        np.testing.assert_array_equal(np.isinf(got), np.isinf(expected))
        np.testing.assert_allclose(got, expected, rtol=float(torch.finfo(getattr(torch, dtype)).eps), atol=0)


def test_gpu_deployments_keep_the_narrow_nodes(tmp_path):
    """A GPU instance's file is not rewritten: the CUDA provider has the narrow kernels."""
    _, proto, _ = _deployed(tmp_path, "bfloat16", instance="gpu")
    assert [n.op_type for n in proto.graph.node] == ["Cast", "Mul", "Gemm", "Constant", "Div", "Cast"]  # the edges'


def _where() -> onnx.ModelProto:
    """out = Where(c, x, y), ``c`` one bool: picks one whole input."""
    from onnx import TensorProto, helper

    from onnx_graphs import model, vi

    return model([helper.make_node("Where", ["c", "x", "y"], ["out"], name="pick")],
                 [vi("c", TensorProto.BOOL, []), vi("x", shape=["N", 4]), vi("y", shape=["N", 4])],
                 [vi("out", shape=["N", 4])], opset=17)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_cpu_deployment_keeps_a_negative_zero_a_where_picks(tmp_path, dtype):
    """The file's Where is an If copying one branch, as in graphc's ort-cpu session: before, its
    narrow Where was computed in float32 between Casts, and onnxruntime's float32 Where returned the
    -0.0s of x as +0.0 where the session, the numpy backend and torch keep them."""
    proto = _where()
    file = str(gc.deploy.triton(gc.load(proto), tmp_path, "m", dtype=dtype) / "1" / "model.onnx")
    onnx.checker.check_model(file, full_check=True)
    converted = gc.convert_float(gc.load(proto), dtype, keep_io_types=True)  # deploy's, before the CPU form
    x = np.array([[-0.0, 1.5, -0.0, -2.0], [0.0, -0.0, 3.0, -0.0]], np.float32)
    feeds = {"c": np.array(True), "x": x, "y": np.ones_like(x)}
    raw = ort.InferenceSession(file, providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    dt = getattr(torch, dtype)
    expected = torch.where(torch.tensor(True), torch.from_numpy(x).to(dt), torch.ones(2, 4, dtype=dt)).float().numpy()
    assert (np.signbit(expected) & (expected == 0)).sum() == 4  # the -0.0s
    for got in (raw, *(gc.Session(converted, backend=b).run(feeds)["out"] for b in ("ort-cpu", "numpy"))):
        np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))
