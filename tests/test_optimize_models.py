"""Soundness of gc.optimize on real graphs: every models/ example, the training artifact graphs,
onnx's own test models and PyTorch exports; outputs vs the original on onnxruntime and the
numpy backend at several batch sizes, interface (symbolic dims included) unchanged."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest

import graphc as gc
from optimize_util import assert_close, assert_levels_sound, assert_same_outputs, interface, op_types, random_feeds, run_ort

ONNX_DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
LIGHT = ["light_squeezenet", "light_shufflenet"]  # 224x224 inputs: the small ones
# onnx's PyTorch conversions (opset 6-12) that onnxruntime still runs
PYTORCH = ["test_Conv2d_depthwise_padded", "test_Conv1d_groups", "test_ConvTranspose2d", "test_Embedding",
           "test_Linear_no_bias", "test_PixelShuffle", "test_MaxPool2d_stride_padding_dilation",
           "test_log_softmax_dim3", "test_Softmin", "test_SELU", "test_ConstantPad2d"]
OUR_EXPORTS = sorted((Path(__file__).parent / "data").glob("*.onnx"))


_soundness = assert_levels_sound


@pytest.mark.parametrize("name", LIGHT)
def test_onnx_zoo_light_models(name):
    _soundness(gc.load(ONNX_DATA / "light" / f"{name}.onnx"), (1, 2, 3), (1,))


@pytest.mark.parametrize("name", PYTORCH)
def test_pytorch_converted(name):
    _soundness(gc.load(ONNX_DATA / "pytorch-converted" / name / "model.onnx"), (1, 2, 3), (1,))


@pytest.mark.skipif(not OUR_EXPORTS, reason="no PyTorch exports in tests/data yet")
@pytest.mark.parametrize("path", OUR_EXPORTS, ids=[p.stem for p in OUR_EXPORTS])
def test_our_pytorch_exports(path):
    _soundness(gc.load(path), (1, 2, 3), (1, 3))


def _examples():
    from graphc.models import EXAMPLES

    return EXAMPLES


@pytest.mark.parametrize("name", ["two_layer_net", "cnn", "resnet", "transformer"])
def test_models_examples_inference(name):
    factory, inputs = _examples()[name]
    model = gc.capture(factory(), **inputs())
    _soundness(model, (1, 2, 3), (1, 3))
    for level in (1, 2, 3):  # the batch dim stays symbolic: never fixed to a test's batch size
        assert gc.optimize(model, level).inputs[0].shape[0] == model.inputs[0].shape[0] == "N"


@pytest.mark.parametrize("name", ["cnn", "resnet", "transformer"])
def test_training_mode_capture_keeps_bn_and_dropout(name):
    factory, inputs = _examples()[name]
    model = gc.capture(factory(), **inputs(), training=True)
    before = (op_types(model).count("BatchNormalization"), _random_dropouts(model))
    for level in (1, 2):
        out = gc.optimize(model, level)
        assert (op_types(out).count("BatchNormalization"), _random_dropouts(out)) == before
        assert interface(out) == interface(model)
    if not before[1]:  # deterministic: outputs must match too
        assert_same_outputs(model, gc.optimize(model, 2), batches=(2,))


def _random_dropouts(model: gc.Model) -> int:
    """Dropouts that may be in training mode (a random mask); inference ones are identities."""
    count = 0
    for node in model.ir.graph:
        if node.op_type == "Dropout":
            mode = node.inputs[2] if len(node.inputs) > 2 else None
            count += mode is not None and (mode.const_value is None or bool(mode.const_value.numpy()))
    return count


def _artifacts(name):
    factory, inputs = _examples()[name]
    model = gc.capture(factory(), **inputs(), training=True)
    try:
        return gc.training.generate(model, gc.losses.cross_entropy("output", label="y"), gc.optim.Adam(1e-3))
    except gc.GraphError as exc:  # autodiff rules land op by op
        pytest.skip(f"gc.training.generate cannot differentiate {name} yet: {str(exc)[:120]}")


@pytest.mark.parametrize("name", ["two_layer_net", "cnn", "resnet", "transformer"])
def test_training_artifact_graphs(name):
    arts = _artifacts(name)
    for graph in ("train_step", "gradients", "eval"):
        model = getattr(arts, graph)
        if _random_dropouts(model):
            # random masks: check structure only, numerics are covered by the other graphs
            for level in (1, 2):
                out = gc.optimize(model, level)
                assert interface(out) == interface(model)
                assert _random_dropouts(out) == _random_dropouts(model)
            continue
        _soundness(model, (1, 2), (2, 3), fixed=_state_feeds(arts, model))
    _soundness(arts.inference, (1, 2, 3), (1, 3))


def _state_feeds(arts, model: gc.Model) -> dict[str, np.ndarray]:
    """Optimizer state and BatchNorm statistics the graph takes as inputs, drawn from |N(0, 1)|:
    second moments and running variances are never negative (a negative one would make every
    update NaN, and NaN == NaN would compare nothing)."""
    rng = np.random.default_rng(1)
    names = {s.name for s in model.inputs}
    return {name: np.abs(rng.standard_normal(value.shape)).astype(value.dtype)
            for name, value in arts.state.items()
            if name in names and np.issubdtype(value.dtype, np.floating) and value.ndim > 0}


def test_optimized_train_step_still_trains_like_original():
    arts = _artifacts("two_layer_net")
    step = arts.train_step
    out = gc.optimize(step, 2)
    feeds = random_feeds(step, 4)
    assert_close(run_ort(step, feeds), run_ort(out, feeds), what="train_step")
    assert len(out.ir.graph) < len(step.ir.graph)
