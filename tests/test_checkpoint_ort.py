"""ort-cpu sessions of gc.grad models with checkpoint regions: the copies run in the backward, where
the graph places them (onnxruntime's fused copies ran first, in the forward), without the memory
pattern; sessions of models without regions keep onnxruntime's defaults.

Oracles: the same model without regions (gradients to 1e-12, float64), onnxruntime's profiler (the
order the nodes ran in), the session's own options, and a small graph sorted by hand."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.backends import graph_order
from graphc.backends.registry import get_backend
from graphc.utils.checkpoint import checkpoint_sequential

ort = pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(0)


class _Deep(gc.nn.Module):
    def __init__(self, regions: bool, dtype: str):
        super().__init__()
        self.regions = regions
        self.body = gc.nn.Sequential(*(layer for _ in range(4) for layer in (gc.nn.Linear(8, 8, dtype=dtype), gc.nn.Tanh())))
        self.head = gc.nn.Linear(8, 3, dtype=dtype)

    def forward(self, x):
        return self.head(checkpoint_sequential(self.body, 2, x, use_reentrant=False) if self.regions else self.body(x))


def _grad_model(regions: bool, dtype: str) -> gc.Model:
    gc.manual_seed(0)
    model = gc.capture(_Deep(regions, dtype), x=gc.spec(dtype, ("N", 8)))
    return gc.grad(model, gc.losses.mse("output", label="y"))


def test_a_region_session_drops_the_memory_pattern_and_keeps_the_gradients():
    batch = {"x": RNG.normal(size=(16, 8)), "y": RNG.normal(size=(16, 3))}
    regions, plain = (gc.Session(_grad_model(r, "float64"), backend="ort-cpu") for r in (True, False))
    got, want = regions.run(batch), plain.run(batch)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-12, atol=1e-15, err_msg=name)
    chosen, default = (s.executable.session.get_session_options() for s in (regions, plain))
    assert chosen.enable_mem_pattern is False
    assert chosen.execution_order == ort.ExecutionOrder.PRIORITY_BASED
    # optimized once at "all", then loaded as it is, in the graph's order
    assert chosen.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    assert default.enable_mem_pattern is True and default.enable_cpu_mem_arena is True
    assert default.execution_order == ort.ExecutionOrder.DEFAULT
    assert default.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL


def test_region_copies_run_in_the_backward(tmp_path):
    """float32: onnxruntime fuses each Gemm + Tanh, copies too; every copy runs after the loss."""
    model = _grad_model(True, "float32")
    executable = get_backend("ort-cpu").prepare(model.proto, profile=str(tmp_path / "trace"))
    executable.run({"x": RNG.normal(size=(16, 8)).astype(np.float32), "y": RNG.normal(size=(16, 3)).astype(np.float32)})
    trace = json.loads(executable.end_profiling().read_text())
    ran = [e["name"].removesuffix("_kernel_time") for e in sorted(trace, key=lambda e: e["ts"])
           if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]
    copies = [i for i, name in enumerate(ran) if "recompute/" in name]
    assert any(name.startswith("fused recompute/") for name in ran)  # the copies were fused
    assert len(copies) >= 2 and min(copies) > ran.index("loss/ReduceMean"), ran


def test_sort_puts_a_made_node_before_its_first_reader():
    """``c`` (a fused copy onnxruntime numbered first) reads only the input: it moves to just
    before ``b2``, its reader, after ``a`` and ``b1``, as ranked."""
    h = onnx.helper
    nodes = [h.make_node("Tanh", ["x"], ["c"], name="fused copy"), h.make_node("Relu", ["x"], ["a"], name="a"),
             h.make_node("Neg", ["a"], ["b1"], name="b1"), h.make_node("Add", ["b1", "c"], ["b2"], name="b2")]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1])],
                         [h.make_tensor_value_info("b2", onnx.TensorProto.FLOAT, [1])])
    graph_order.sort(graph, {"a": 0, "b1": 1, "copy": 2, "b2": 3})
    assert [n.name for n in graph.node] == ["a", "b1", "fused copy", "b2"]


class _Wide(gc.nn.Module):
    """65 Linear layers: 130 params, one flat buffer whose ``Split`` sizes (1040 bytes of int64)
    onnxruntime writes to the optimized model's external file."""

    def __init__(self, regions: bool):
        super().__init__()
        self.regions = regions
        self.body = gc.nn.Sequential(*(layer for _ in range(65) for layer in (gc.nn.Linear(2, 2, dtype="float64"),
                                                                               gc.nn.Tanh())))

    def forward(self, x):
        return checkpoint_sequential(self.body, 5, x, use_reentrant=False) if self.regions else self.body(x)


def test_a_region_train_step_of_128_params_or_more_loads_in_graph_order():
    """The sorted graph reads its integer initializers inline: onnxruntime's shape inference
    could not read the flat buffer's Split sizes from the external file, and refused the session."""
    batch, losses = {"x": RNG.normal(size=(8, 2)), "y": RNG.normal(size=(8, 2))}, {}
    for regions in (True, False):
        gc.manual_seed(0)
        model = gc.capture(_Wide(regions), x=gc.spec("float64", ("N", 2)))
        arts = gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.AdamW(1e-2))
        trainer = gc.Trainer(arts, backend="ort-cpu")
        if regions:
            options = trainer._train.session.get_session_options()
            assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # graph order
        losses[regions] = [trainer.step(batch) for _ in range(3)]
    np.testing.assert_allclose(losses[True], losses[False], rtol=1e-12)


def test_region_sessions_choose_pattern_and_order_per_device():
    """The option assembly of both providers, checked on the CPU (no GPU needed, none mocked): region
    copies turn the memory pattern off on either device; graph order is the CPU's only, asked or not."""
    assert graph_order.session_order("cpu", copies=True) == (False, True)
    assert graph_order.session_order("cuda", copies=True) == (False, False)
    for device in ("cpu", "cuda"):
        assert graph_order.session_order(device, copies=False) == (True, False)
        assert graph_order.session_order(device, copies=True, mem_pattern=True) == (True, device == "cpu")
    assert graph_order.session_order("cpu", copies=False, graph_order=True) == (True, True)
    with pytest.raises(ValueError, match=r"graph_order runs on the CPU provider \(backend 'ort-cpu'\), not on "
                                         r"'cuda': reloading the graph onnxruntime optimized there"):
        graph_order.session_order("cuda", copies=True, graph_order=True)
