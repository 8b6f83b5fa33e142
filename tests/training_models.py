"""Hand-built ONNX models for the training-artifact tests, shaped like real exports."""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx.numpy_helper as nh

import graphc as gc

F = onnx.TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits, opset=17, producer="pytorch") -> gc.Model:
    graph = oh.make_graph(nodes, "imported", inputs, outputs, inits)
    proto = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)], producer_name=producer)
    onnx.checker.check_model(proto, full_check=True)
    return gc.load(proto)


def mlp(din=8, hidden=16, classes=4, seed=0) -> gc.Model:
    """Gemm(transB) - Relu - Gemm, as torch.onnx exports nn.Sequential(Linear, ReLU, Linear)."""
    rng = np.random.default_rng(seed)
    inits = [nh.from_array(rng.normal(0, 0.3, (hidden, din)).astype(np.float32), "fc1.weight"),
             nh.from_array(rng.normal(0, 0.1, hidden).astype(np.float32), "fc1.bias"),
             nh.from_array(rng.normal(0, 0.3, (classes, hidden)).astype(np.float32), "fc2.weight"),
             nh.from_array(rng.normal(0, 0.1, classes).astype(np.float32), "fc2.bias")]
    nodes = [oh.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
             oh.make_node("Relu", ["h"], ["hr"]),
             oh.make_node("Gemm", ["hr", "fc2.weight", "fc2.bias"], ["logits"], transB=1)]
    return _model(nodes, [oh.make_tensor_value_info("x", F, ["batch", din])],
                  [oh.make_tensor_value_info("logits", F, ["batch", classes])], inits)


def awkward(seed=0, dropout=0.1) -> gc.Model:
    """An export with the usual oddities:

    * ``proj.weight`` lives in a ``Constant`` node (not an initializer);
    * ``emb.weight`` is read directly and through an ``Identity`` alias (``head.weight``), as
      tied weights come out of torch.onnx;
    * a Reshape whose target shape is computed with Shape/Gather/Unsqueeze/Concat;
    * ``scale`` is a float scalar Constant (stays a constant);
    * Dropout with ratio ``dropout`` (training mode in train_step, identity in eval/inference).
    x [B, 6] -> x @ proj.weight^T [B, 8] -> Reshape [B, 2, 4] -> Reshape [B, 8] -> Dropout
    -> MatMul emb.weight [8, 8] -> Relu -> MatMul head.weight (= emb.weight) -> * scale + head.bias.
    """
    rng = np.random.default_rng(seed)
    proj = rng.normal(0, 0.4, (8, 6)).astype(np.float32)
    inits = [nh.from_array(rng.normal(0, 0.4, (8, 8)).astype(np.float32), "emb.weight"),
             nh.from_array(rng.normal(0, 0.1, 8).astype(np.float32), "head.bias")]
    nodes = [
        oh.make_node("Constant", [], ["proj.weight"], value=nh.from_array(proj)),
        oh.make_node("Constant", [], ["scale"], value=nh.from_array(np.array(0.5, np.float32))),
        oh.make_node("Gemm", ["x", "proj.weight"], ["p"], transB=1),
        oh.make_node("Shape", ["p"], ["p_shape"]),
        oh.make_node("Constant", [], ["zero"], value=nh.from_array(np.array(0, np.int64))),
        oh.make_node("Gather", ["p_shape", "zero"], ["batch"], axis=0),
        oh.make_node("Constant", [], ["axes0"], value=nh.from_array(np.array([0], np.int64))),
        oh.make_node("Unsqueeze", ["batch", "axes0"], ["batch1"]),
        oh.make_node("Constant", [], ["rest"], value=nh.from_array(np.array([2, 4], np.int64))),
        oh.make_node("Concat", ["batch1", "rest"], ["shape3"], axis=0),
        oh.make_node("Reshape", ["p", "shape3"], ["p3"]),
        oh.make_node("Constant", [], ["flat"], value=nh.from_array(np.array([-1, 8], np.int64))),
        oh.make_node("Reshape", ["p3", "flat"], ["p2"]),
        oh.make_node("Constant", [], ["ratio"], value=nh.from_array(np.array(dropout, np.float32))),
        oh.make_node("Dropout", ["p2", "ratio"], ["pd"]),
        oh.make_node("MatMul", ["pd", "emb.weight"], ["h"]),
        oh.make_node("Relu", ["h"], ["hr"]),
        oh.make_node("Identity", ["emb.weight"], ["head.weight"]),
        oh.make_node("MatMul", ["hr", "head.weight"], ["o"]),
        oh.make_node("Mul", ["o", "scale"], ["os"]),
        oh.make_node("Add", ["os", "head.bias"], ["out"]),
    ]
    # another exporter's: torch.onnx keeps every parameter in an initializer, never a Constant
    return _model(nodes, [oh.make_tensor_value_info("x", F, ["B", 6])],
                  [oh.make_tensor_value_info("out", F, ["B", 8])], inits, producer="an exporter")


def pooled_batchnorm(batch: int | str = "?", length: int | str = "?", channels=3, classes=4, seed=0) -> gc.Model:
    """x [batch, C, length] -> BatchNormalization -> mean over the length -> Gemm: both dims may be
    symbolic, named or not (Paddle writes ``?`` for each unknown one)."""
    rng = np.random.default_rng(seed)
    inits = [nh.from_array(rng.uniform(0.5, 1.5, channels).astype(np.float32), "bn.weight"),
             nh.from_array(rng.normal(0, 0.1, channels).astype(np.float32), "bn.bias"),
             nh.from_array(rng.normal(0, 0.1, channels).astype(np.float32), "bn.running_mean"),
             nh.from_array(rng.uniform(0.5, 1.5, channels).astype(np.float32), "bn.running_var"),
             nh.from_array(rng.normal(0, 0.3, (classes, channels)).astype(np.float32), "fc.weight"),
             nh.from_array(np.zeros(classes, np.float32), "fc.bias")]
    nodes = [oh.make_node("BatchNormalization", ["x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"],
                          ["xn"], epsilon=1e-5, momentum=0.9),
             oh.make_node("ReduceMean", ["xn"], ["xp"], axes=[2], keepdims=0),
             oh.make_node("Gemm", ["xp", "fc.weight", "fc.bias"], ["logits"], transB=1)]
    return _model(nodes, [oh.make_tensor_value_info("x", F, [batch, channels, length])],
                  [oh.make_tensor_value_info("logits", F, [batch, classes])], inits)


def batchnorm(channels=3, classes=4, seed=0, batch: int | str = "N", scaled: bool = False) -> gc.Model:
    """x [batch, C, L] -> (``scaled``: times a trained ``s.weight`` [C, 1], so the BatchNorm's input
    has a gradient) -> BatchNormalization (momentum 0.9 = PyTorch's 0.1) -> Flatten -> Gemm."""
    rng = np.random.default_rng(seed)
    length = 5
    inits = [nh.from_array(rng.uniform(0.5, 1.5, channels).astype(np.float32), "bn.weight"),
             nh.from_array(rng.normal(0, 0.1, channels).astype(np.float32), "bn.bias"),
             nh.from_array(rng.normal(0, 0.2, channels).astype(np.float32), "bn.running_mean"),
             nh.from_array(rng.uniform(0.5, 1.5, channels).astype(np.float32), "bn.running_var"),
             nh.from_array(rng.normal(0, 0.3, (classes, channels * length)).astype(np.float32), "fc.weight"),
             nh.from_array(np.zeros(classes, np.float32), "fc.bias")]
    nodes = [oh.make_node("BatchNormalization", ["xs" if scaled else "x", "bn.weight", "bn.bias", "bn.running_mean",
                                                 "bn.running_var"], ["xn"], epsilon=1e-5, momentum=0.9),
             oh.make_node("Flatten", ["xn"], ["xf"], axis=1),
             oh.make_node("Gemm", ["xf", "fc.weight", "fc.bias"], ["logits"], transB=1)]
    if scaled:
        inits.append(nh.from_array(rng.uniform(0.5, 1.5, (channels, 1)).astype(np.float32), "s.weight"))
        nodes.insert(0, oh.make_node("Mul", ["x", "s.weight"], ["xs"]))
    return _model(nodes, [oh.make_tensor_value_info("x", F, [batch, channels, length])],
                  [oh.make_tensor_value_info("logits", F, [batch, classes])], inits)
