"""RNN/GRU/LSTM activations whose alpha/beta are left out take the ONNX defaults (those of the op of
that name: ThresholdedRelu alpha 1, Affine 1 and 0, ScaledTanh 1 and 1, LeakyRelu 0.01, HardSigmoid
0.2 and 0.5, Elu 1) on the numpy backend and on ort-cpu (whose own defaults for the first three are
0: ``backends/recurrent.py``), against the recurrence written out in numpy."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

import graphc as gc

SPEC = {"ThresholdedRelu": lambda v: np.where(v > 1.0, v, 0.0), "Affine": lambda v: v,
        "ScaledTanh": np.tanh, "LeakyRelu": lambda v: np.where(v >= 0, v, 0.01 * v),
        "HardSigmoid": lambda v: np.clip(0.2 * v + 0.5, 0, 1), "Elu": lambda v: np.where(v > 0, v, np.expm1(v))}
RNG = np.random.default_rng(0)
X = 2 * RNG.standard_normal((3, 2, 4))
W, R = RNG.standard_normal((1, 5, 4)), 0.5 * RNG.standard_normal((1, 5, 5))


def _rnn(attrs: dict) -> onnx.ModelProto:
    """y = RNN(x, w, r) in float32, w and r initializers."""
    node = helper.make_node("RNN", ["x", "w", "r"], ["y"], hidden_size=5, **attrs)
    inits = [onnx.numpy_helper.from_array(v.astype(np.float32), n) for v, n in ((W, "w"), (R, "r"))]
    graph = helper.make_graph([node], "rnn", [helper.make_tensor_value_info("x", 1, X.shape)],
                              [helper.make_tensor_value_info("y", 1, [3, 1, 2, 5])], initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


@pytest.mark.parametrize("activation", list(SPEC))
@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_left_out_activation_params_take_the_onnx_defaults(activation, backend):
    h, want = np.zeros((2, 5)), []
    for t in range(len(X)):
        h = SPEC[activation](X[t] @ W[0].T + h @ R[0].T)
        want.append(h)
    model = gc.load(_rnn({"activations": [activation]}))
    got = gc.Session(model, backend=backend).run({"x": X.astype(np.float32)})["y"]
    np.testing.assert_allclose(got[:, 0], np.stack(want), rtol=1e-5, atol=1e-5)


def test_a_short_alpha_list_is_filled_with_defaults_in_order():
    """A GRU's HardSigmoid takes alpha 0.3 and beta 0.6 from the lists, and its ScaledTanh after it
    the defaults (1, 1): onnxruntime alone takes 0 for both, and the GRU's output would be all zeros."""
    gru = helper.make_node("GRU", ["x", "w", "r"], ["y"], hidden_size=2, activations=["HardSigmoid", "ScaledTanh"],
                           activation_alpha=[0.3], activation_beta=[0.6])
    w, r = RNG.standard_normal((1, 6, 4)), RNG.standard_normal((1, 6, 2))
    graph = helper.make_graph([gru], "gru", [helper.make_tensor_value_info("x", 1, X.shape)],
                              [helper.make_tensor_value_info("y", 1, [3, 1, 2, 2])],
                              initializer=[onnx.numpy_helper.from_array(v.astype(np.float32), n)
                                           for v, n in ((w, "w"), (r, "r"))])
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    ref, ort = (gc.Session(model, backend=b).run({"x": X.astype(np.float32)})["y"] for b in ("numpy", "ort-cpu"))
    assert np.abs(ref).max() > 0.1
    np.testing.assert_allclose(ort, ref, rtol=1e-5, atol=1e-5)
