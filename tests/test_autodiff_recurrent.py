"""RNN, GRU and LSTM are differentiated by unrolling them over their sequence.

Oracles: onnxruntime's own fused kernels for the unrolled forward, float64 central differences
for every input's gradient (fixed and symbolic batch, both layouts, all directions, states,
peepholes, ``linear_before_reset``), and torch.autograd on exported ``nn.LSTM``/``nn.GRU``."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper
from onnx import numpy_helper as nh

import graphc as gc
from graphc.passes.autodiff import gradient_model
from graphc.passes.autodiff.recurrent import unroll_recurrent
from graphc.backends.numpy import NumpyBackend

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
T, N, I, H = 3, 2, 3, 4

# (op, direction, layout, which optional inputs, extra attributes, symbolic batch, outputs used)
CONFIGS = [
    ("RNN", "forward", 0, {"B", "initial_h"}, {}, False, (0, 1)),
    ("RNN", "bidirectional", 1, set(), {}, True, (0, 1)),
    ("GRU", "forward", 0, {"B"}, {}, True, (0, 1)),
    ("GRU", "reverse", 0, {"B", "initial_h"}, {"linear_before_reset": 1}, False, (1,)),
    ("GRU", "bidirectional", 1, {"B", "initial_h"}, {"linear_before_reset": 1}, True, (0,)),
    ("LSTM", "forward", 0, {"B", "initial_h", "initial_c", "P"}, {}, True, (0, 1, 2)),
    ("LSTM", "bidirectional", 1, {"B", "P"}, {}, False, (0, 2)),
    ("LSTM", "reverse", 0, {"sequence_lens", "initial_c"}, {}, True, (1,)),
    # clip, other activations (with alpha/beta), input_forget, ragged and run-time sequence_lens
    ("LSTM", "forward", 0, {"B", "P", "initial_h"}, {"clip": 0.7}, False, (0, 1, 2)),
    ("LSTM", "bidirectional", 0, {"B"}, {"input_forget": 1, "activations": ["HardSigmoid", "Softsign", "Affine"] * 2,
                                        "activation_alpha": [0.3, 0.5, 0.25, 1.5], "activation_beta": [0.4, 0.1, 0.6, 0.2]},
     False, (0, 2)),
    ("GRU", "forward", 1, {"B", "ragged"}, {"activations": ["Sigmoid", "ScaledTanh"], "activation_alpha": [1.5],
                                           "activation_beta": [0.8], "clip": 1.2}, False, (0, 1)),
    ("GRU", "bidirectional", 0, {"ragged"}, {"linear_before_reset": 1}, True, (0, 1)),
    ("RNN", "reverse", 0, {"B", "fed_lens"}, {"activations": ["Softplus"]}, True, (0, 1)),
    ("LSTM", "bidirectional", 1, {"B", "P", "ragged", "initial_c"}, {}, False, (0, 1, 2)),
]
IDS = [f"{c[0]}-{c[1]}-layout{c[2]}-{'-'.join(sorted(c[3])) or 'bare'}{''.join('-' + k for k in c[4])}"
       f"{'-symbolic' if c[5] else ''}" for c in CONFIGS]


def recurrent_model(op, direction, layout, optional, attrs, symbolic, used, dtype=np.float64, seed=0):
    """One recurrent node over parameter initializers; its used outputs are weighted by random
    constants and summed into the scalar ``loss``. ``x`` is the graph input."""
    rng = np.random.default_rng(seed)
    dirs, gates = 2 if direction == "bidirectional" else 1, GATES[op]
    batch = "N" if symbolic else N
    values = {"W": rng.normal(0, 0.5, (dirs, gates * H, I)), "R": rng.normal(0, 0.5, (dirs, gates * H, H))}
    state_shape = (N, dirs, H) if layout else (dirs, N, H)
    lens = np.array([T, 1], np.int32) if "ragged" in optional or "fed_lens" in optional else np.full(N, T, np.int32)
    optional = set(optional) | ({"sequence_lens"} if {"ragged", "fed_lens"} & set(optional) else set())
    optional_values = {"B": rng.normal(0, 0.5, (dirs, 2 * gates * H)), "sequence_lens": lens,
                       "initial_h": rng.normal(0, 0.5, state_shape), "initial_c": rng.normal(0, 0.5, state_shape),
                       "P": rng.normal(0, 0.5, (dirs, 3 * H))}
    names = ["x", "W", "R", "B", "sequence_lens", "initial_h", "initial_c", "P"][:8 if op == "LSTM" else 6]
    inputs = [n if n in ("x", "W", "R") or n in optional else "" for n in names]
    while inputs[-1] == "":
        inputs.pop()
    values.update({k: v for k, v in optional_values.items() if k in optional})
    outputs = ["Y", "Y_h", "Y_c"][:3 if op == "LSTM" else 2]
    outputs = [o if i in used else "" for i, o in enumerate(outputs)]
    nodes = [helper.make_node(op, inputs, outputs, hidden_size=H, direction=direction, layout=layout, **attrs)]
    full = {"Y": (N, T, dirs, H) if layout else (T, dirs, N, H), "Y_h": state_shape, "Y_c": state_shape}
    sums = []
    for o in filter(None, outputs):
        values[f"{o}_weight"] = rng.normal(size=full[o])
        nodes += [helper.make_node("Mul", [o, f"{o}_weight"], [f"{o}_weighted"]),
                  helper.make_node("ReduceSum", [f"{o}_weighted"], [f"{o}_sum"], keepdims=0)]
        sums.append(f"{o}_sum")
    nodes.append(helper.make_node("Sum", sums, ["loss"]))
    elem = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    x_shape = [batch, T, I] if layout else [T, batch, I]
    graph = helper.make_graph(
        nodes, op, [helper.make_tensor_value_info("x", elem, x_shape)], [helper.make_tensor_value_info("loss", elem, [])],
        [nh.from_array(v.astype(dtype) if v.dtype.kind == "f" else v, k) for k, v in values.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22)], ir_version=10)
    x = rng.normal(size=(N, T, I) if layout else (T, N, I)).astype(dtype)
    if "fed_lens" in optional:  # sequence_lens as a graph input fed at run time, not a constant
        init = next(t for t in model.graph.initializer if t.name == "sequence_lens")
        model.graph.initializer.remove(init)
        model.graph.input.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, [batch]))
    return model, x, [k for k in ("W", "R", "B", "initial_h", "initial_c", "P") if k in values]


def feeds_for(model: onnx.ModelProto, x: np.ndarray) -> dict:
    feeds = {"x": x}
    if any(i.name == "sequence_lens" for i in model.graph.input):
        feeds["sequence_lens"] = np.array([T, 1], np.int32)
    return feeds


def _ort(model: onnx.ModelProto, feeds: dict) -> dict:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))


def run_numpy(model: onnx.ModelProto, feeds: dict) -> dict:
    return NumpyBackend().prepare(model).run(feeds)


def _with_outputs(model: onnx.ModelProto, names) -> onnx.ModelProto:
    new = onnx.ModelProto()
    new.CopyFrom(model)
    del new.graph.output[:]
    new.graph.output.extend(helper.make_empty_tensor_value_info(n) for n in names)
    return new


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_unrolled_forward_matches_the_fused_kernels(config):
    """Against onnxruntime's fused kernel (it refuses layout 1) and the numpy backend's."""
    model, x, _ = recurrent_model(*config, dtype=np.float32)
    _check_forward(model, x, layout=config[2])


def _check_forward(model: onnx.ModelProto, x: np.ndarray, layout: int) -> None:
    x = x.astype(np.float32)
    if model.graph.initializer[0].data_type != TensorProto.FLOAT:
        model = _as_float32(model)
    outs = [o for o in model.graph.node[0].output if o] + ["loss"]
    feeds = feeds_for(model, x)
    oracles = [run_numpy(_with_outputs(model, outs), feeds)]
    if not layout:
        oracles.append(_ort(_with_outputs(model, outs), feeds))
    unrolled_ir = ir.serde.deserialize_model(model)
    assert unroll_recurrent(unrolled_ir) == 1
    onnx.checker.check_model(ir.serde.serialize_model(unrolled_ir), full_check=True)
    unrolled = _with_outputs(ir.serde.serialize_model(unrolled_ir), outs)
    assert model.graph.node[0].op_type not in {n.op_type for n in unrolled.graph.node}
    for got in (_ort(unrolled, feeds), run_numpy(unrolled, feeds)):
        for expected in oracles:
            for name in outs:
                np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-5, err_msg=name)


def _as_float32(model: onnx.ModelProto) -> onnx.ModelProto:
    new = onnx.ModelProto()
    new.CopyFrom(model)
    for t in new.graph.initializer:
        if t.data_type == TensorProto.DOUBLE:
            t.CopyFrom(nh.from_array(nh.to_array(t).astype(np.float32), t.name))
    for v in [*new.graph.input, *new.graph.output]:
        if v.type.tensor_type.elem_type == TensorProto.DOUBLE:
            v.type.tensor_type.elem_type = TensorProto.FLOAT
    return new


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_gradients_match_finite_differences(config):
    model, x, params = recurrent_model(*config)
    _check_gradients(model, x, params)


def _check_gradients(model: onnx.ModelProto, x: np.ndarray, params: list[str]) -> None:
    proto = gc.Model(gradient_model(ir.serde.deserialize_model(model), "loss", [*params, "x"])).proto
    feeds = feeds_for(model, x)
    grads = run_numpy(proto, feeds)
    base = {t.name: nh.to_array(t) for t in model.graph.initializer} | {"x": x}
    rng, eps = np.random.default_rng(1), 1e-6
    for name in [*params, "x"]:
        direction = rng.normal(size=base[name].shape)
        loss = {s: run_numpy(proto, {**feeds, name: base[name] + s * eps * direction})["loss"] for s in (1, -1)}
        numeric = (loss[1] - loss[-1]) / (2 * eps)
        np.testing.assert_allclose(np.sum(grads[f"{name}_grad"] * direction), numeric, rtol=1e-6, atol=1e-8,
                                   err_msg=name)


def _symbolic_length(model: onnx.ModelProto, layout: int) -> onnx.ModelProto:
    model.graph.input[0].type.tensor_type.shape.dim[1 if layout else 0].dim_param = "T"
    return model


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_a_symbolic_sequence_length_runs_as_a_scan_like_the_fused_kernels(config):
    """A length known only at run time: each direction becomes a Scan over the steps (the same
    cell), which computes what the fused kernels do."""
    model, x, _ = recurrent_model(*config, dtype=np.float32)
    scanned = ir.serde.deserialize_model(_symbolic_length(model, config[2]))
    assert unroll_recurrent(scanned) == 1
    assert "Scan" in {n.op_type for n in scanned.graph}
    _check_forward(model, x, layout=config[2])


@pytest.mark.parametrize("config", CONFIGS, ids=IDS)
def test_a_symbolic_sequence_length_gets_gradients_through_the_scans(config):
    """Reverse mode through the Scans (``_reverse_scan``): central differences for every input."""
    model, x, params = recurrent_model(*config)
    _check_gradients(_symbolic_length(model, config[2]), x, params)


@pytest.mark.parametrize("length", [T, "T"])
def test_lstm_whose_initial_h_and_c_are_one_tensor_gets_both_gradients(length):
    """initial_h and initial_c name the same initializer: at a run-time length the Scan carries
    it in two slots, and its gradient is the sum of both (central differences)."""
    model, x, params = recurrent_model("LSTM", "forward", 0, {"initial_h"}, {}, False, (0, 1))
    model.graph.node[0].input.append("initial_h")
    model = _symbolic_length(model, 0) if length == "T" else model
    _check_gradients(model, x, params)


def test_sequence_lens_input_whose_default_is_the_full_length_masks_what_is_fed():
    """sequence_lens is a graph input whose initializer (every sequence full) is only a default:
    the gradient graph masks the lengths it is fed ([T, 1]); loss as the fused RNN computes it,
    gradients central differences."""
    model, x, params = recurrent_model("RNN", "forward", 0, {"B", "sequence_lens"}, {}, False, (0, 1))
    model.graph.input.append(helper.make_tensor_value_info("sequence_lens", TensorProto.INT32, [N]))
    feeds = feeds_for(model, x)
    grads = gc.Model(gradient_model(ir.serde.deserialize_model(model), "loss", params)).proto
    np.testing.assert_allclose(run_numpy(grads, feeds)["loss"], run_numpy(model, feeds)["loss"], rtol=1e-12)
    _check_gradients(model, x, params)


@pytest.mark.parametrize("activation", ["Relu", "LeakyRelu", "ThresholdedRelu", "Elu", "Affine", "ScaledTanh",
                                        "HardSigmoid", "Softsign", "Softplus", "Sigmoid"])
def test_every_activation_unrolls_like_onnxruntime_and_differentiates(activation):
    model, x, params = recurrent_model("RNN", "forward", 0, {"B"}, {"activations": [activation],
                                                                  "activation_alpha": [0.4], "activation_beta": [0.3]},
                                       False, (0, 1))
    _check_forward(model, x, layout=0)
    _check_gradients(model, x, params)


@pytest.mark.parametrize("length", [T, "T"])  # a symbolic length trains through a Scan
def test_lstm_model_trains_and_inference_keeps_the_fused_op(length):
    """An LSTM classifier trains on onnxruntime and numpy alike (same losses step for step), its
    loss falls, and the eval/inference graphs keep the LSTM node."""
    rng = np.random.default_rng(0)
    classes = 3
    inits = {"W": rng.normal(0, 0.3, (1, 4 * H, I)), "R": rng.normal(0, 0.3, (1, 4 * H, H)),
             "B": np.zeros((1, 8 * H)), "head": rng.normal(0, 0.3, (H, classes))}
    nodes = [helper.make_node("LSTM", ["x", "W", "R", "B"], ["", "h"], hidden_size=H, layout=1),
             helper.make_node("Squeeze", ["h", "one"], ["last"]),
             helper.make_node("MatMul", ["last", "head"], ["logits"])]
    graph = helper.make_graph(nodes, "lstm", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", length, I])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", classes])],
                              [nh.from_array(v.astype(np.float32), k) for k, v in inits.items()]
                              + [nh.from_array(np.array([1]), "one")])
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.Adam(0.05))
    ops = {key: {n.op_type for n in g.proto.graph.node} for key, g in arts.graphs.items()}
    assert "LSTM" in ops["inference"] and "LSTM" in ops["eval"] and "LSTM" not in ops["train_step"]
    assert ("Scan" in ops["train_step"]) == isinstance(length, str)
    for graph_model in arts.graphs.values():
        onnx.checker.check_model(graph_model.proto, full_check=True)
    x = rng.normal(size=(16, T, I)).astype(np.float32)
    batch = {"x": x, "y": (x[:, :, 0].sum(1) > 0).astype(np.int64) + (x[:, -1, 1] > 1)}
    from test_training_artifacts import train
    ort_losses, _ = train(arts, batch, 40)
    numpy_losses, _ = train(arts, batch, 40, backend="numpy")
    np.testing.assert_allclose(numpy_losses, ort_losses, rtol=1e-3, atol=1e-4)
    assert ort_losses[-1] < 0.5 * ort_losses[0], ort_losses


def test_two_unnamed_lstms_unroll_apart_and_train():
    """Two stacked LSTM nodes without names unroll under one scope (``LSTM/unrolled``): their
    nodes still get names of their own (the second unrolling once reused one of the first's,
    and onnxruntime refused the training graphs), and the model trains on both backends alike."""
    rng = np.random.default_rng(1)
    inits = {"W1": rng.normal(0, 0.4, (1, 4 * H, I)), "R1": rng.normal(0, 0.4, (1, 4 * H, H)),
             "W2": rng.normal(0, 0.4, (1, 4 * H, H)), "R2": rng.normal(0, 0.4, (1, 4 * H, H))}
    nodes = [helper.make_node("LSTM", ["x", "W1", "R1"], ["y1"], hidden_size=H),
             helper.make_node("Squeeze", ["y1", "one"], ["h1"]),
             helper.make_node("LSTM", ["h1", "W2", "R2"], ["y2"], hidden_size=H),
             helper.make_node("Squeeze", ["y2", "one"], ["out"])]
    graph = helper.make_graph(nodes, "lstms", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [T, N, I])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, [T, N, H])],
                              [nh.from_array(v.astype(np.float32), k) for k, v in inits.items()]
                              + [nh.from_array(np.array([1]), "one")])
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    arts = gc.training.generate(model, gc.losses.mse("out", label="t"), gc.optim.Adam(0.05))
    for key, graph_model in arts.graphs.items():
        names = [n.name for n in graph_model.proto.graph.node if n.name]
        assert len(names) == len(set(names)), (key, sorted({n for n in names if names.count(n) > 1}))
    batch = {"x": rng.normal(size=(T, N, I)).astype(np.float32), "t": np.full((T, N, H), 0.3, np.float32)}
    from test_training_artifacts import train
    ort_losses, _ = train(arts, batch, 30)
    numpy_losses, _ = train(arts, batch, 30, backend="numpy")
    np.testing.assert_allclose(numpy_losses, ort_losses, rtol=1e-3, atol=1e-5)
    assert ort_losses[-1] < 0.5 * ort_losses[0], ort_losses


TORCH_GATE_ORDER = {"LSTM": [0, 3, 1, 2], "GRU": [1, 0, 2]}  # ONNX gate k is torch's gate ORDER[k]


def _torch_grads_in_onnx_layout(layer, kind: str, num_layers: int) -> list[dict[str, np.ndarray]]:
    """Per layer, torch's parameter gradients arranged like the exported op's W, R and B."""
    def reorder(t):
        chunks = t.detach().chunk(len(TORCH_GATE_ORDER[kind]))
        return np.concatenate([chunks[k].numpy() for k in TORCH_GATE_ORDER[kind]])

    grads = []
    for layer_index in range(num_layers):
        sfx = [f"_l{layer_index}", f"_l{layer_index}_reverse"]
        get = lambda name: [reorder(getattr(layer, name + s).grad) for s in sfx]  # noqa: E731
        grads.append({"W": np.stack(get("weight_ih")), "R": np.stack(get("weight_hh")),
                      "B": np.concatenate([np.stack(get("bias_ih")), np.stack(get("bias_hh"))], axis=1)})
    return grads


def _weighted_bidirectional(torch, kind: str, layers: int, dynamic_time: bool):
    """A float64 ``layers``-layer bidirectional batch-first nn.LSTM/nn.GRU (I -> H, seed 0) whose loss is its
    output times a fixed weight, summed: one weight per feature with a dynamic time axis, else per step too."""
    torch.manual_seed(0)

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layer = getattr(torch.nn, kind)(I, H, num_layers=layers, batch_first=True, bidirectional=True)
            self.register_buffer("weight", torch.randn(2 * H) if dynamic_time else torch.randn(T, 2 * H))

        def forward(self, x):
            return (self.layer(x)[0] * self.weight).sum()

    return Net().double()


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning",
                            "ignore:Converting a tensor to a Python boolean")
# A dynamic time axis only through TorchScript: once a process has exported an nn.LSTM with the
# dynamo exporter, torch 2.13 specializes its time axis in later dynamo exports (reset or not).
@pytest.mark.parametrize("dynamo, dynamic_time", [(False, False), (True, False), (False, True)],
                         ids=["torchscript", "dynamo", "torchscript-dynamic_time"])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_exported_torch_recurrent_layer_gradients_match_torch(kind, dynamo, dynamic_time, tmp_path):
    """torch's exporters write a 2-layer bidirectional nn.LSTM/nn.GRU as one ONNX op per layer
    (gates reordered, biases side by side). In float64, the gradients of the input and of each
    op's W, R and B equal torch.autograd's, at the export's batch size and at another one (the
    batch dim is symbolic); with a dynamic time axis too (the Scan form), at two lengths."""
    torch = pytest.importorskip("torch")
    layers = 2
    net = _weighted_bidirectional(torch, kind, layers, dynamic_time)
    x = torch.randn(N, T, I, dtype=torch.float64, requires_grad=True)
    path = tmp_path / "rnn.onnx"
    axes = {0: "N", 1: "T"} if dynamic_time else {0: "N"}
    shapes = {"dynamic_shapes": {"x": {0: "N"}}} if dynamo else {"dynamic_axes": {"x": axes}, "opset_version": 17}
    torch.onnx.export(net, (x,), str(path), input_names=["x"], output_names=["loss"], dynamo=dynamo, **shapes)
    model = gc.load(path)
    nodes = [n for n in model.proto.graph.node if n.op_type == kind]
    assert len(nodes) == layers
    params = {t.name for t in model.proto.graph.initializer}
    wrt = {(i, role): name for i, n in enumerate(nodes) for role, name in zip("WRB", n.input[1:4])}
    assert set(wrt.values()) <= params, "the exported W, R and B are initializers"
    proto = gc.Model(gradient_model(ir.serde.deserialize_model(model.proto), "loss", ["x", *wrt.values()])).proto
    assert ("Scan" in {n.op_type for n in proto.graph.node}) == dynamic_time
    for batch, length in ((N, T), (5, T + 2 if dynamic_time else T)):
        x = torch.randn(batch, length, I, dtype=torch.float64, requires_grad=True)
        net.zero_grad()
        net(x).backward()
        got = run_numpy(proto, {"x": x.detach().numpy()})
        np.testing.assert_allclose(got["x_grad"], x.grad.numpy(), rtol=1e-7, atol=1e-10)
        for i, expected in enumerate(_torch_grads_in_onnx_layout(net.layer, kind, layers)):
            for role, value in expected.items():
                np.testing.assert_allclose(got[f"{wrt[i, role]}_grad"], value, rtol=1e-7, atol=1e-10,
                                           err_msg=f"layer {i} {role}")


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning", "ignore::FutureWarning",
                            "ignore:Converting a tensor to a Python boolean")
@pytest.mark.parametrize("dynamic_time", [False, True], ids=["unrolled", "scan"])
@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_torch_layout_recurrent_parameters_get_torch_gradients_without_pads(kind, dynamic_time, tmp_path):
    """Exported without constant folding, a 2-layer bidirectional nn.LSTM/nn.GRU keeps torch's
    parameters (names and gate layout) and reorders their gate blocks by Slice + Concat before each
    op. Their float64 gradients equal torch.autograd's as they are, on numpy and onnxruntime, and
    each reorder's gradient is its inverse permutation (Split + Concat), no Pad per gate block."""
    torch = pytest.importorskip("torch")
    net = _weighted_bidirectional(torch, kind, 2, dynamic_time)
    x = torch.randn(N, T, I, dtype=torch.float64, requires_grad=True)
    path = tmp_path / "rnn.onnx"
    torch.onnx.export(net, (x,), str(path), input_names=["x"], output_names=["loss"], dynamo=False, opset_version=17,
                      dynamic_axes={"x": {0: "N", 1: "T"} if dynamic_time else {0: "N"}}, do_constant_folding=False)
    params = dict(net.named_parameters())
    model = gc.load(path)
    assert set(params) <= {t.name for t in model.proto.graph.initializer}, "torch's parameters, in torch's layout"
    proto = gc.Model(gradient_model(ir.serde.deserialize_model(model.proto), "loss", ["x", *params])).proto
    onnx.checker.check_model(proto, full_check=True)
    ops = [n.op_type for n in proto.graph.node]
    assert "Pad" not in ops and ("Scan" in ops) == dynamic_time
    x = torch.randn(5, T + 2 if dynamic_time else T, I, dtype=torch.float64, requires_grad=True)
    net(x).backward()
    for got in (run_numpy(proto, {"x": x.detach().numpy()}), _ort(proto, {"x": x.detach().numpy()})):
        np.testing.assert_allclose(got["x_grad"], x.grad.numpy(), rtol=1e-7, atol=1e-10)
        for name, p in params.items():
            np.testing.assert_allclose(got[f"{name}_grad"], p.grad.numpy(), rtol=1e-7, atol=1e-10, err_msg=name)
