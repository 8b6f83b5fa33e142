"""The example models: capture, full ONNX check at every opset, symbolic batch at several sizes,
source lines, determinism, eager capture and output naming."""

from __future__ import annotations

import numpy as np
import pytest

import graphc as gc
from graphc.model import SOURCE_KEY
from graphc.models import EXAMPLES
try:
    from dsl_util import check, rng, run_ort
except ImportError:  # tests/ collected as a package
    from tests.dsl_util import check, rng, run_ort


def _feeds(model: gc.Model, batch: int) -> dict[str, np.ndarray]:
    feeds = {}
    r = rng(batch)
    for sp in model.inputs:
        shape = tuple(batch if isinstance(d, str) else d for d in sp.shape)
        values = r.integers(0, 50, shape) if sp.dtype == "int64" else r.standard_normal(shape)
        feeds[sp.name] = values.astype(np.dtype(sp.dtype))
    return feeds


@pytest.fixture(scope="module", params=sorted(EXAMPLES))
def example(request):
    factory, inputs = EXAMPLES[request.param]
    return request.param, factory, inputs


@pytest.mark.parametrize("opset", [17, 21, 23])
def test_example_models_pass_the_full_checker(example, opset):
    name, factory, inputs = example
    model = gc.capture(factory(), opset=opset, **inputs())
    check(model)
    assert model.opset == opset
    assert [o.name for o in model.outputs] == ["output"]
    assert model.outputs[0].shape[0] == "N"


def test_example_models_run_at_several_batch_sizes(example):
    name, factory, inputs = example
    model = gc.capture(factory(), **inputs())
    for batch in (1, 3, 8):
        feeds = _feeds(model, batch)
        out = run_ort(model, feeds)["output"]
        assert out.shape == (batch, 10)
        assert np.isfinite(out).all()
    # rows are independent: running a batch equals running its rows one by one
    feeds = _feeds(model, 4)
    full = run_ort(model, feeds)["output"]
    one = run_ort(model, {k: v[2:3] for k, v in feeds.items()})["output"]
    np.testing.assert_allclose(one[0], full[2], rtol=1e-4, atol=1e-5)


def test_every_node_has_a_source_line(example):
    name, factory, inputs = example
    model = gc.capture(factory(), **inputs())
    for node in model.ir.graph:
        src = node.metadata_props.get(SOURCE_KEY, "")
        assert src.split(":")[0].endswith(f"models/{name}.py") or "<output" in src, (node.name, src)
    assert any(p.key == SOURCE_KEY for p in model.proto.graph.node[0].metadata_props)


def test_capture_is_deterministic(example):
    name, factory, inputs = example
    a = gc.capture(factory(), **inputs()).proto.SerializeToString()
    b = gc.capture(factory(), **inputs()).proto.SerializeToString()
    assert a == b


def test_eager_capture_matches_onnxruntime():
    factory, inputs = EXAMPLES["cnn"]
    x = rng(5).standard_normal((2, 1, 28, 28)).astype(np.float32)
    seen = []

    class Probe(factory):
        def forward(self, x):
            out = super().forward(x)
            seen.append(out.numpy())
            print(out)  # shows the value
            return out

    model = gc.capture(Probe(), x=x)
    check(model)
    np.testing.assert_allclose(run_ort(model, {"x": x})["output"], seen[0], rtol=1e-4, atol=1e-5)


def test_eager_print_shows_values(capsys):
    def f(x):
        y = x * 2
        print(y)
        return y

    gc.capture(f, x=np.array([1.0, 2.0], np.float32))
    assert "[2. 4.]" in capsys.readouterr().out


def test_output_naming():
    spec = gc.spec("float32", ("N", 3))
    assert [o.name for o in gc.capture(lambda x: x * 2, x=spec).outputs] == ["output"]
    assert [o.name for o in gc.capture(lambda x: (x, x * 2), x=spec).outputs] == ["output_0", "output_1"]
    model = gc.capture(lambda x: {"logits": x + 1, "probs": gc.softmax(x)}, x=spec)
    assert [o.name for o in model.outputs] == ["logits", "probs"]
    # an input passed through, and the same value twice, still give valid graphs
    model = gc.capture(lambda x: {"a": x, "b": x}, x=spec)
    check(model)
    out = run_ort(model, {"x": np.ones((2, 3), np.float32)})
    assert set(out) == {"a", "b"}


def test_plain_python_loops_unroll():
    def f(x):
        for _ in range(3):
            x = gc.relu(x) + 1
        if x.shape[1] == 3:  # static: decided at capture
            x = x * 2
        return x

    model = gc.capture(f, x=gc.spec("float32", ("N", 3)))
    assert [n.op_type for n in model.ir.graph if n.op_type != "Constant"] == ["Relu", "Add"] * 3 + ["Mul"]
    x = rng(0).standard_normal((2, 3)).astype(np.float32)
    expected = x
    for _ in range(3):
        expected = np.maximum(expected, 0) + 1
    np.testing.assert_allclose(run_ort(model, {"x": x})["output"], expected * 2)


def test_symbolic_reshape_keeps_dims():
    def f(x):
        n, t, c = x.shape
        return x.reshape(n, t, 2, c // 2).transpose(0, 2, 1, 3).reshape(n, -1)

    model = gc.capture(f, x=gc.spec("float32", ("N", "T", 4)))
    check(model)
    assert model.outputs[0].shape == ("N", None)
    x = rng(0).standard_normal((2, 5, 4)).astype(np.float32)
    np.testing.assert_allclose(run_ort(model, {"x": x})["output"],
                               x.reshape(2, 5, 2, 2).transpose(0, 2, 1, 3).reshape(2, -1))


def test_deep_mlp_captures():
    """A 200-layer MLP captures to 400 nodes (its capture time, up to 1,000 layers, is measured in
    scripts/bench_capture.py)."""
    layers = [gc.nn.Linear(16, 16) for _ in range(200)]
    net = gc.nn.Sequential(*[m for layer in layers for m in (layer, gc.nn.ReLU())])
    model = gc.capture(net, x=gc.spec("float32", ("N", 16)))
    assert len(model.ir.graph) == 400
    check(model)


def test_output_keys_may_reuse_automatic_value_names():
    model = gc.capture(lambda x: {"relu": gc.relu(x) * 2, "mul": gc.relu(x)}, x=gc.spec("float32", ("N", 3)))
    check(model)
    assert [o.name for o in model.outputs] == ["relu", "mul"]
    out = run_ort(model, {"x": np.array([[-1, 0, 2]], np.float32)})
    np.testing.assert_array_equal(out["relu"], [[0, 0, 4]])
    with pytest.raises(gc.GraphError, match="input"):
        gc.capture(lambda x: {"x": x * 2}, x=gc.spec("float32", (3,)))
