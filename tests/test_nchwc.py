"""Convs with fed weights on onnxruntime's NCHWc kernels (``graphc.backends.nchwc``): the
rewritten graph computes what the Conv does (onnxruntime's generic kernel and the numpy
backend as oracles), only where it measured faster, and ort-cpu sessions at level "all" take it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from graphc.backends import nchwc
from onnx_graphs import model, node, vi

BLOCK = nchwc.block_size()
needs_nchwc = pytest.mark.skipif(not BLOCK, reason="onnxruntime has no NCHWc kernels on this CPU")


def conv_model(x_shape, w_shape, bias: bool = False, constant_weight: bool = False, **attrs) -> onnx.ModelProto:
    """y = Conv(x, w[, b]), every input fed (or w an initializer)."""
    inputs = ["x", "w"] + (["b"] if bias else [])
    values = [vi("x", shape=list(x_shape))] + ([] if constant_weight else [vi("w", shape=list(w_shape))])
    values += [vi("b", shape=[w_shape[0]])] if bias else []
    weight = {"w": np.random.default_rng(3).normal(size=w_shape).astype(np.float32)} if constant_weight else {}
    return model([node("Conv", inputs, ["y"], "conv_0", "net.py:7", **attrs)], values, [vi("y", shape=[None] * 4)],
                 weight, opset=17)


def feeds_for(proto: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    shapes = {v.name: [d.dim_value or 2 for d in v.type.tensor_type.shape.dim] for v in proto.graph.input}
    return {k: rng.normal(size=s).astype(np.float32) for k, s in shapes.items()}


def blocked_ops(proto: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in proto.graph.node if n.domain == nchwc.NCHWC]


CASES = {  # (x, w, attrs, bias, kind's reorders)
    "dense 3x3, pads": ((2, 32, 9, 8), (32, 32, 3, 3), {"pads": [1, 1, 1, 1]}, False),
    "dense, output channels padded to a block, bias": ((2, 16, 7, 7), (20, 16, 3, 3), {"pads": [1, 0, 1, 2]}, True),
    "dense, strides, dilations": ((1, 32, 11, 10), (16, 32, 3, 2), {"strides": [2, 1], "dilations": [1, 2],
                                                                     "pads": [1, 1, 0, 0]}, True),
    "stem of 3 channels, 7x7 stride 2": ((2, 3, 16, 16), (24, 3, 7, 7), {"strides": [2, 2], "pads": [3, 3, 3, 3]}, True),
    "depthwise 3x3 stride 2": ((2, 32, 9, 9), (32, 1, 3, 3), {"group": 32, "strides": [2, 2], "pads": [1, 1, 1, 1]}, False),
    "depthwise 5x5, bias": ((3, 16, 6, 6), (16, 1, 5, 5), {"group": 16, "pads": [2, 2, 2, 2]}, True),
    "depthwise dW's Conv, dy its 8x8 kernel": ((1, 32, 20, 12), (32, 1, 8, 8), {"group": 32, "pads": [1, 1, 1, 1],
                                                                            "dilations": [2, 1]}, False),
}


@needs_nchwc
@pytest.mark.parametrize("case", list(CASES))
def test_rewritten_conv_computes_the_conv(case):
    """Each kind the NCHWc kernels take (channels sized to suit a block of 8 or 16), rewritten
    regardless of speed: the same output as the Conv on onnxruntime's generic kernel and on the
    numpy backend, the rewritten graph holding ReorderOutput (and ReorderInput unless the
    input has fewer channels than a block)."""
    x_shape, w_shape, attrs, bias = CASES[case]
    if x_shape[1] % BLOCK and x_shape[1] >= BLOCK:
        pytest.skip(f"{x_shape[1]} channels do not fill blocks of {BLOCK}")
    proto = conv_model(x_shape, w_shape, bias, **attrs)
    rewritten, count = nchwc.rewrite(proto, BLOCK, only_faster=False)
    assert count == 1
    reorders = ["ReorderOutput"] + (["ReorderInput"] if x_shape[1] >= BLOCK else [])
    assert sorted(blocked_ops(rewritten)) == sorted(["Conv", *reorders])
    assert blocked_ops(proto) == []  # the caller's model is left as it was
    feeds = feeds_for(proto)
    got = run_ort(rewritten, feeds)
    generic = gc.Session(proto, backend="ort-cpu", threads=1, graph_optimization_level="extended").run(feeds)["y"]
    reference = gc.Session(proto, backend="numpy").run(feeds)["y"]
    np.testing.assert_allclose(got, reference, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(generic, reference, rtol=1e-4, atol=1e-4)


def run_ort(proto: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """y of ``proto`` on a plain onnxruntime session (its com.microsoft.nchwc ops are onnxruntime's)."""
    import onnxruntime as ort

    proto.ir_version = 10
    return ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"]).run(["y"], feeds)[0]


@needs_nchwc
def test_sessions_take_the_rewrite_at_level_all_only():
    """ort-cpu at level "all" (whose layout transforms are NCHWc's) runs the rewritten graph
    (its nodes in the placement, the Conv keeping its name); "extended" runs the Conv as it is."""
    proto = conv_model((32, 64, 16, 16), (64, 64, 3, 3), pads=[1, 1, 1, 1])
    blocked, generic = (gc.Session(proto, backend="ort-cpu", graph_optimization_level=level) for level in ("all", "extended"))
    assert "conv_0" in blocked.placement and "y/nchwc/input" in blocked.placement
    assert not any("nchwc" in name for name in generic.placement)
    feeds = feeds_for(proto)
    np.testing.assert_allclose(blocked.run(feeds)["y"], generic.run(feeds)["y"], rtol=1e-4, atol=1e-4)


@needs_nchwc
@pytest.mark.parametrize(("why", "proto"), [
    ("1x1: a GEMM already", conv_model((32, 64, 16, 16), (64, 64, 1, 1))),
    ("a constant weight: onnxruntime reorders it once", conv_model((32, 64, 16, 16), (64, 64, 3, 3), constant_weight=True)),
    ("a dense Conv on too few pixels", conv_model((2, 64, 16, 16), (64, 64, 3, 3), pads=[1, 1, 1, 1])),
    ("a dense dW's Conv, dy its kernel", conv_model((16, 32, 40, 40), (64, 32, 20, 20))),
    ("a 7x7 stem's dW over swapped axes at batch 2, its output past 3x3",
     conv_model((3, 2, 64, 64), (64, 2, 32, 32), pads=[3, 3, 3, 3], dilations=[2, 2])),
    ("a 3x3 dW over swapped axes, dy past SWAPPED_MAX_TAPS", conv_model((64, 2, 32, 32), (64, 2, 32, 32), pads=[1] * 4)),
    ("a depthwise 1x1 (a BatchNorm's affine)", conv_model((32, 64, 16, 16), (64, 1, 1, 1), group=64)),
    ("grouped, not depthwise", conv_model((32, 64, 16, 16), (64, 16, 3, 3), group=4)),
    ("input channels past a block, not whole blocks", conv_model((32, 40, 16, 16), (64, 40, 3, 3))),
    ("auto_pad", conv_model((32, 64, 16, 16), (64, 64, 3, 3), auto_pad="SAME_UPPER")),
])
def test_convs_the_kernels_would_not_speed_up_stay(why, proto):
    rewritten, count = nchwc.rewrite(proto, BLOCK)
    assert (count, rewritten) == (0, proto), why


@needs_nchwc
def test_unnamed_convs_are_rewritten_apart():
    """Two Convs without node names get nodes and values of their own (named after their
    outputs), and the session loads and computes both."""
    proto = conv_model((32, 16, 16, 16), (16, 16, 3, 3), pads=[1, 1, 1, 1])
    proto.graph.node[0].name = ""
    proto.graph.node.append(onnx.helper.make_node("Conv", ["y", "w"], ["z"], pads=[1, 1, 1, 1]))
    proto.graph.output[0].name = "z"
    rewritten, count = nchwc.rewrite(proto, BLOCK)
    assert count == 2
    feeds = feeds_for(proto)
    expected = gc.Session(proto, backend="numpy").run(feeds)["z"]
    np.testing.assert_allclose(gc.Session(proto, backend="ort-cpu").run(feeds)["z"], expected, rtol=1e-4, atol=1e-3)


@needs_nchwc
def test_a_dense_conv_on_enough_pixels_is_rewritten_with_a_symbolic_batch():
    """The batch times output pixels that pays for the weight's reorder; a symbolic batch counts
    as 16: 16 x 8x8 pixels reach ``DENSE_MIN_PIXELS`` (1,024), 16 x 4x4 do not."""
    for side, expected in ((8, 1), (4, 0)):
        proto = conv_model(("N", 64, side, side), (64, 64, 3, 3), pads=[1, 1, 1, 1])
        assert nchwc.rewrite(proto, BLOCK)[1] == expected, side


def test_the_gradient_rules_count_on_the_backends_threshold():
    """The training graphs leave a dense Conv a Conv (not gathered columns) where ort-cpu runs it
    on the NCHWc kernels, and take a small batch's 3x3 dW as the Conv over swapped axes there:
    the rules' copies of the thresholds are the backend's."""
    from graphc.passes.autodiff import rules_nn

    assert rules_nn.NCHWC_MIN_PIXELS == nchwc.DENSE_MIN_PIXELS
    assert rules_nn.NCHWC_SWAPPED_TAPS == nchwc.SWAPPED_MAX_TAPS


@needs_nchwc
def test_a_small_batchs_3x3_weight_gradient_conv_is_rewritten():
    """A 3x3 conv's dW over swapped axes at batch 2 (x [Ci, 2, 16, 16], dy [Co, 2, 16, 16] its
    kernel, output 3x3), 256 taps, runs on the NCHWc kernels (input left NCHW) and computes the Conv."""
    proto = conv_model((64, 2, 16, 16), (64, 2, 16, 16), pads=[1, 1, 1, 1])
    rewritten, count = nchwc.rewrite(proto, BLOCK)
    assert count == 1 and sorted(blocked_ops(rewritten)) == ["Conv", "ReorderOutput"]
    feeds = feeds_for(proto)
    np.testing.assert_allclose(run_ort(rewritten, feeds), gc.Session(proto, backend="numpy").run(feeds)["y"],
                               rtol=1e-4, atol=1e-3)


@needs_nchwc
@pytest.mark.parametrize(("batch", "swapped"), [(2, True), (8, False)])
def test_a_small_batchs_3x3_weight_gradient_is_the_swapped_conv(monkeypatch, batch, swapped):
    """Generated for this CPU, a 64-channel 3x3 conv on 16x16 at batch 2 takes its dW as the Conv
    over swapped axes (dy its kernel, ``rules_nn.swaps_on_nchwc``), at batch 8 the gathered columns;
    both give torch's gradients on ort-cpu (the NCHWc kernels) and the numpy backend."""
    torch = pytest.importorskip("torch")
    from graphc import nn
    from graphc.compile import training

    monkeypatch.setattr(training, "_nchwc_block", lambda: BLOCK)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = nn.Conv2d(64, 64, 3, padding=1, bias=False)

        def forward(self, x):
            return {"y": self.conv(x)}

    rng = np.random.default_rng(5)
    x = rng.normal(size=(batch, 64, 16, 16)).astype(np.float32)
    target = rng.normal(size=(batch, 64, 16, 16)).astype(np.float32)
    captured = gc.capture(Net(), x=gc.spec("float32", x.shape, name="x"))
    arts = gc.training.generate(captured, gc.losses.mse("y", label="t"), gc.optim.SGD(1.0))
    kernels = [n.input[1] for n in arts.train_step.proto.graph.node if n.op_type == "Conv"]
    assert (kernels != ["conv.weight"]) == swapped  # the forward's, and dy for the dW over swapped axes
    assert any(n.op_type == "Gather" for n in arts.train_step.proto.graph.node) != swapped
    weight = np.array(gc.Trainer(arts, backend="numpy").params["conv.weight"])
    w = torch.tensor(weight, dtype=torch.float64, requires_grad=True)
    y = torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float64), w, padding=1)
    torch.nn.functional.mse_loss(y, torch.tensor(target, dtype=torch.float64)).backward()
    for backend in ("ort-cpu", "numpy"):
        trainer = gc.Trainer(arts, backend=backend)
        trainer.step({"x": x, "t": target})
        dw = weight - np.asarray(trainer.params["conv.weight"])  # SGD at lr 1: the step is the gradient
        np.testing.assert_allclose(dw, w.grad.numpy(), rtol=1e-3, atol=1e-6, err_msg=backend)


@needs_nchwc
def test_training_a_conv_net_on_the_rewritten_graphs_matches_the_numpy_backend():
    """A train step of a conv net whose forward Convs and input gradients the rewrite takes
    (a 3-channel stem, a dense 3x3 at batch 16 on 16x16, a depthwise 3x3): ort-cpu's loss and
    updated params after three SGD steps equal the numpy backend's."""
    from graphc import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 3, padding=1)
            self.dense = nn.Conv2d(16, 16, 3, padding=1)
            self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            h = gc.relu(self.dense(gc.relu(self.stem(x))))
            return {"logits": self.head(gc.mean(self.depthwise(h), axis=(2, 3)))}

    rng = np.random.default_rng(0)
    batch = {"x": rng.normal(size=(16, 3, 16, 16)).astype(np.float32), "y": rng.integers(0, 4, 16)}
    captured = gc.capture(Net(), x=gc.spec("float32", (16, 3, 16, 16), name="x"))
    arts = gc.training.generate(captured, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1, momentum=0.9))
    session = gc.Session(arts.train_step.proto, backend="ort-cpu")
    assert "Conv" in blocked_ops(nchwc.rewrite(arts.train_step.proto, BLOCK)[0])
    assert any("/nchwc/" in name for name in session.placement)
    trainers = {b: gc.Trainer(arts, backend=b) for b in ("ort-cpu", "numpy")}
    for _ in range(3):
        losses = {b: t.step(batch) for b, t in trainers.items()}
        np.testing.assert_allclose(losses["ort-cpu"], losses["numpy"], rtol=1e-4)
    for name, value in trainers["numpy"].params.items():
        np.testing.assert_allclose(np.asarray(trainers["ort-cpu"].params[name]), np.asarray(value), rtol=1e-3,
                                   atol=1e-5, err_msg=name)


@needs_nchwc
def test_depthwise_weight_gradients_are_chosen_for_the_nchwc_kernels(monkeypatch):
    """Generated for this CPU (its onnxruntime has NCHWc kernels), a stride-1 depthwise conv's dW
    is the Conv over the images' channels as groups (group = N*C, dy its kernel), which ort-cpu
    runs on those kernels; without them, the row products (MatMuls). Both train as the numpy
    backend does."""
    from graphc import nn
    from graphc.compile import training

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.stem = nn.Conv2d(3, 16, 1)
            self.depthwise = nn.Conv2d(16, 16, 3, padding=1, groups=16)
            self.head = nn.Linear(16, 4)

        def forward(self, x):
            return {"logits": self.head(gc.mean(self.depthwise(self.stem(x)), axis=(2, 3)))}

    rng = np.random.default_rng(1)
    batch = {"x": rng.normal(size=(4, 3, 16, 16)).astype(np.float32), "y": rng.integers(0, 4, 4)}
    captured = gc.capture(Net(), x=gc.spec("float32", (4, 3, 16, 16), name="x"))

    def generate():
        return gc.training.generate(captured, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(0.1))

    for block, per_image in ((BLOCK, True), (0, False)):
        monkeypatch.setattr(training, "_nchwc_block", lambda block=block: block)
        arts = generate()
        groups = [a.i for n in arts.train_step.proto.graph.node if n.op_type == "Conv" for a in n.attribute
                  if a.name == "group"]
        assert (4 * 16 in groups) == per_image, block
        trainers = {b: gc.Trainer(arts, backend=b) for b in ("ort-cpu", "numpy")}
        for _ in range(2):
            losses = {b: t.step(batch) for b, t in trainers.items()}
            np.testing.assert_allclose(losses["ort-cpu"], losses["numpy"], rtol=1e-4)
        np.testing.assert_allclose(np.asarray(trainers["ort-cpu"].params["depthwise.weight"]),
                                   np.asarray(trainers["numpy"].params["depthwise.weight"]), rtol=1e-3, atol=1e-5)
