"""Inputs that also have an initializer (overridable defaults, ONNX IR >= 4): a fed value overrides
the default and an unfed one reads it, on every backend, through ``Session.run`` and ``run_bound``
(onnxruntime's IOBinding, ``backends/iobinding.py``), after the session's rewrites of a
Conv2d-BatchNorm2d-ReLU net: float64 (``doubles``), float32 with a conv of 16 channels whose fed
weight the NCHWc rewrite blocks (``nchwc``), BatchNorm in inference and in training mode
(``batchnorm``). Oracle: torch 2.13, its module loaded with the same values."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
from backend_params import CUDA, options

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
BACKENDS = ["numpy", "ort-cpu", CUDA]
TOLERANCE = {"float64": {"rtol": 1e-12, "atol": 1e-12}, "float32": {"rtol": 1e-4, "atol": 1e-4}}
CHANNELS = {"float64": 3, "float32": 16}  # float32 at 16 channels, 8x8 maps, batch 16: a conv nchwc takes


class _Net(gc.nn.Module):
    def __init__(self, dtype: str, channels: int):
        super().__init__()
        self.conv = gc.nn.Conv2d(channels, channels, 3, padding=1, dtype=dtype)
        self.bn = gc.nn.BatchNorm2d(channels, dtype=dtype)

    def forward(self, x):
        return gc.relu(self.bn(self.conv(x)))


def _with_param_inputs(model: gc.Model) -> onnx.ModelProto:
    """``model``'s file with each initializer also a graph input (its default)."""
    proto = model.proto
    fed = {i.name for i in proto.graph.input}
    proto.graph.input.extend(onnx.helper.make_tensor_value_info(t.name, t.data_type, list(t.dims))
                             for t in proto.graph.initializer if t.name not in fed)
    onnx.checker.check_model(proto, full_check=True)
    return proto


def _torch_forward(state: dict, x: np.ndarray, training: bool) -> np.ndarray:
    channels = x.shape[1]
    dtype = torch.float64 if x.dtype == np.float64 else torch.float32
    net = torch.nn.Sequential(torch.nn.Conv2d(channels, channels, 3, padding=1, dtype=dtype),
                              torch.nn.BatchNorm2d(channels, dtype=dtype), torch.nn.ReLU())
    net.load_state_dict({k.replace("conv.", "0.").replace("bn.", "1."): torch.from_numpy(np.array(v))
                         for k, v in state.items()})
    with torch.no_grad():
        return net.train(training)(torch.from_numpy(x)).numpy()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("training", [False, True], ids=["eval", "train"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_fed_value_overrides_the_default_and_unfed_reads_it(backend, training, dtype):
    """ort-cpu's ``run_bound`` raised 'Failed to find NodeArg with name: conv.weight in the def list'
    for a fed initializer-backed input (``Session.run`` took it); both paths now equal torch's forward
    with the fed values, and with the defaults where nothing is fed."""
    channels = CHANNELS[dtype]
    net = _Net(dtype, channels)
    net.bn.running_mean.data = RNG.standard_normal(channels).astype(dtype)  # non-trivial defaults
    net.bn.running_var.data = RNG.uniform(0.5, 2.0, channels).astype(dtype)
    proto = _with_param_inputs(gc.capture(net, training=training, x=gc.spec(dtype, ("N", channels, 8, 8))))
    sess = gc.Session(proto, backend=backend, **options(backend))
    assert sess.optional_inputs == {"conv.weight", "conv.bias", "bn.weight", "bn.bias", "bn.running_mean",
                                    "bn.running_var"}
    defaults = {k: np.array(v) for k, v in net.state_dict().items() if k in sess.optional_inputs}
    fed = {"conv.weight": RNG.standard_normal((channels, channels, 3, 3)).astype(dtype) / 4,
           "bn.weight": RNG.uniform(0.5, 1.5, channels).astype(dtype)}
    x = RNG.standard_normal((16, channels, 8, 8)).astype(dtype)
    for feeds, state in (({"x": x}, defaults), ({"x": x, **fed}, {**defaults, **fed})):
        want = _torch_forward(state, x, training)
        np.testing.assert_allclose(sess.run(feeds)["output"], want, **TOLERANCE[dtype], err_msg=f"run {sorted(feeds)}")
        host, _ = sess.run_bound(feeds, ["output"])
        np.testing.assert_allclose(host["output"], want, **TOLERANCE[dtype], err_msg=f"run_bound {sorted(feeds)}")


def test_nchwc_takes_a_conv_whose_weight_is_an_overridable_default():
    """The weight may be fed, so ort-cpu's NCHWc rewrite reorders it in the graph (onnxruntime's own
    layout transformer leaves an overridable initializer alone): it took such a Conv for a constant
    and left it on the generic kernel (float32, 16 channels, 8x8, batch 16: 0.10 ms a run, now 0.06)."""
    from graphc.backends import nchwc

    if nchwc.block_size() not in (8, 16):
        pytest.skip(f"no NCHWc kernels of a block dividing 16 here (block {nchwc.block_size()})")
    proto = _with_param_inputs(gc.capture(_Net("float32", 16), x=gc.spec("float32", ("N", 16, 8, 8))))
    assert nchwc.rewrite(proto, nchwc.block_size())[1] == 1
