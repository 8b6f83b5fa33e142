"""float64 RNN, GRU and LSTM run on ort-cpu (onnxruntime has no double kernels for them:
``backends/doubles_recurrent.py`` writes each direction out as a Scan over the cell): single nodes against the
numpy backend to ~1e-12 over directions, layouts, ``sequence_lens``, initial states, every activation with and
without alpha/beta, ``clip``, peepholes, ``input_forget``, ``linear_before_reset`` and the optional outputs; in a
Loop body; ``gc.nn.RNN/GRU/LSTM`` in float64 against torch (bidirectional, batch_first, 2 layers, packed runs);
float32 models untouched."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import onnx_ir as ir
import pytest
from onnx import helper, numpy_helper

import graphc as gc
from graphc.backends import doubles, doubles_recurrent
from graphc.errors import BackendError
from graphc.nn.utils import rnn as gr

RNG = np.random.default_rng(0)
GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
T, B, I, H = 5, 3, 4, 3


def _node_model(op: str, attrs: dict, inputs: tuple = (), outputs=("y", "y_h", "y_c"),
                dtype=onnx.TensorProto.DOUBLE, steps: int = T) -> tuple[gc.Model, dict]:
    """One ``op`` node of x [steps, B, I] (layout 0) with W, R and the optional ``inputs`` ("b", "lens", "h0", "c0",
    "p"; the lengths and states fed at run time, b and p initializers); its feeds."""
    dirs = 2 if attrs.get("direction") == "bidirectional" else 1
    layout, gates = attrs.get("layout", 0), GATES[op]
    np_type = helper.tensor_dtype_to_np_dtype(dtype)
    x = RNG.standard_normal((B, steps, I) if layout else (steps, B, I))
    inits = {"w": RNG.standard_normal((dirs, gates * H, I)), "r": 0.7 * RNG.standard_normal((dirs, gates * H, H))}
    if "b" in inputs:
        inits["b"] = RNG.standard_normal((dirs, 2 * gates * H))
    if "p" in inputs:
        inits["p"] = RNG.standard_normal((dirs, 3 * H))
    state = (B, dirs, H) if layout else (dirs, B, H)
    feeds = {"x": x.astype(np_type)}
    if "lens" in inputs:
        feeds["lens"] = np.minimum([T, 2, 4], steps).astype(np.int32)
    for s in ("h0", "c0"):
        if s in inputs:
            feeds[s] = RNG.standard_normal(state).astype(np_type)
    order = ["x", "w", "r", "b", "lens", "h0", "c0", "p"][:{"RNN": 6, "GRU": 6, "LSTM": 8}[op]]
    names = [n if n in ("x", "w", "r") or n in inputs else "" for n in order]
    while not names[-1]:
        names.pop()
    outputs = list(outputs)[:3 if op == "LSTM" else 2]
    node = helper.make_node(op, names, outputs, name=f"the_{op.lower()}", hidden_size=H, **attrs)
    graph_inputs = [helper.make_tensor_value_info(k, onnx.TensorProto.INT32 if k == "lens" else dtype, v.shape)
                    for k, v in feeds.items()]
    shapes = {"y": (B, steps, dirs, H) if layout else (steps, dirs, B, H), "y_h": state, "y_c": state}
    graph = helper.make_graph([node], "recurrent", graph_inputs,
                              [helper.make_tensor_value_info(o, dtype, shapes[o]) for o in outputs if o],
                              initializer=[numpy_helper.from_array(v.astype(np_type), k) for k, v in inits.items()])
    return gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])), feeds


def _assert_ort_is_numpy(model: gc.Model, feeds: dict, rtol: float = 1e-12) -> dict:
    want = gc.Session(model, backend="numpy").run(feeds)
    got = gc.Session(model, backend="ort-cpu").run(feeds)
    assert set(got) == set(want)
    for k, v in want.items():
        assert got[k].dtype == np.float64 and got[k].shape == v.shape, k
        np.testing.assert_allclose(got[k], v, rtol=rtol, atol=rtol * max(1.0, np.abs(v).max(initial=0)), err_msg=k)
    return got


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("extras", [(), ("b", "lens", "h0", "c0")], ids=["bare", "bias lens states"])
def test_directions_layouts_lengths_and_states_match_numpy(op, direction, layout, extras):
    model, feeds = _node_model(op, {"direction": direction, "layout": layout}, extras)
    got = _assert_ort_is_numpy(model, feeds)
    if "lens" in extras:  # the short rows emit zeros past their length
        y = got["y"] if not layout else got["y"].transpose(1, 2, 0, 3)
        assert np.all(y[2:, :, 1] == 0) and np.abs(y[:2, :, 1]).min() > 0


ACTIVATIONS = ["Sigmoid", "Tanh", "Relu", "Affine", "LeakyRelu", "ThresholdedRelu", "ScaledTanh", "HardSigmoid",
               "Elu", "Softsign", "Softplus"]


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("given", [False, True], ids=["defaults", "alpha beta"])
def test_each_activation_matches_numpy(activation, given):
    """A bidirectional RNN: the forward direction takes the listed alpha/beta, the reverse one the defaults."""
    attrs = {"direction": "bidirectional", "activations": [activation, activation]}
    if given:
        attrs.update(activation_alpha=[0.4], activation_beta=[-0.3])
    model, feeds = _node_model("RNN", attrs, ("b",))
    feeds["x"] *= 3  # both sides of every kink, past Softplus's and Elu's small range
    _assert_ort_is_numpy(model, feeds)


CASES = {  # name: (op, attributes, optional inputs)
    "RNN clip relu": ("RNN", {"activations": ["Relu"], "clip": 0.8}, ("b",)),
    "GRU linear_before_reset": ("GRU", {"linear_before_reset": 1}, ("b", "h0")),
    "GRU linear_before_reset no bias": ("GRU", {"linear_before_reset": 1, "direction": "bidirectional"}, ()),
    "GRU linear_before_reset lens reverse": ("GRU", {"linear_before_reset": 1, "direction": "reverse"},
                                             ("b", "lens")),
    "GRU clip": ("GRU", {"clip": 0.5, "direction": "bidirectional"}, ("b",)),
    "GRU activations short alpha list": ("GRU", {"activations": ["HardSigmoid", "ScaledTanh", "Sigmoid", "Softsign"],
                                                 "activation_alpha": [0.3], "activation_beta": [0.6],
                                                 "direction": "bidirectional"}, ("b",)),
    "LSTM peepholes": ("LSTM", {}, ("b", "p", "h0", "c0")),
    "LSTM peepholes bidirectional lens layout": ("LSTM", {"direction": "bidirectional", "layout": 1},
                                                 ("b", "lens", "p", "c0")),
    "LSTM input_forget": ("LSTM", {"input_forget": 1}, ("b", "p")),
    "LSTM clip": ("LSTM", {"clip": 0.6, "direction": "reverse"}, ("b", "p", "h0", "c0")),
    "LSTM activations": ("LSTM", {"activations": ["HardSigmoid", "Elu", "Softplus"], "activation_alpha": [0.3, 0.7],
                                  "clip": 2.0}, ("b",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_attribute_combinations_match_numpy(case):
    op, attrs, inputs = CASES[case]
    _assert_ort_is_numpy(*_node_model(op, attrs, inputs))


_OUTPUTS = {"y": ("y", "", ""), "y_h": ("", "y_h", ""), "y_c": ("", "", "y_c"), "y only listed": ("y",),
            "y_h only listed": ("", "y_h")}


@pytest.mark.parametrize("op, outputs", [(op, name) for op in ("GRU", "LSTM") for name in _OUTPUTS
                                         if op == "LSTM" or name != "y_c"])
def test_optional_outputs_present_or_absent(op, outputs):
    outputs = _OUTPUTS[outputs]
    model, feeds = _node_model(op, {"direction": "bidirectional"}, ("b", "lens"), outputs)
    got = _assert_ort_is_numpy(model, feeds)
    assert set(got) == {o for o in outputs[:2 if op == "GRU" else 3] if o}


@pytest.mark.parametrize("op", list(GATES))
@pytest.mark.parametrize("layout", [0, 1])
def test_an_empty_sequence_keeps_the_initial_states(op, layout):
    """No steps: Y empty of its full shape, Y_h and Y_c the initial states (each Scan runs under
    ``scans.guard_empty``'s If, of the batch the body declares)."""
    model, feeds = _node_model(op, {"direction": "bidirectional", "layout": layout}, ("b", "h0", "c0"), steps=0)
    got = _assert_ort_is_numpy(model, feeds)
    assert got["y"].shape == ((B, 0, 2, H) if layout else (0, 2, B, H))
    np.testing.assert_array_equal(got["y_h"], feeds["h0"])


def test_unknown_activation_is_refused_by_name():
    model = _node_model("RNN", {"activations": ["Swish"]})[0]
    with pytest.raises(BackendError, match=r"activations.*'Swish'.*'the_rnn'"):
        gc.Session(model, backend="ort-cpu")


def test_in_a_loop_body():
    """An LSTM of the loop's carried value, three times over: the write-out reaches Loop bodies."""
    lstm = helper.make_node("LSTM", ["v", "w", "r", "b"], ["y", "h"], hidden_size=I)
    squeeze = helper.make_node("Squeeze", ["y", "one"], ["v_next"])
    body = helper.make_graph(
        [helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.array([1], np.int64))),
         lstm, squeeze, helper.make_node("Identity", ["cond"], ["cond_out"])], "body",
        [helper.make_tensor_value_info("i", onnx.TensorProto.INT64, []),
         helper.make_tensor_value_info("cond", onnx.TensorProto.BOOL, []),
         helper.make_tensor_value_info("v", onnx.TensorProto.DOUBLE, [T, B, I])],
        [helper.make_tensor_value_info("cond_out", onnx.TensorProto.BOOL, []),
         helper.make_tensor_value_info("v_next", onnx.TensorProto.DOUBLE, [T, B, I])])
    loop = helper.make_node("Loop", ["n", "", "x"], ["out"], body=body)
    inits = {"n": np.array(3, np.int64), "w": RNG.standard_normal((1, 4 * I, I)),
             "r": RNG.standard_normal((1, 4 * I, I)), "b": RNG.standard_normal((1, 8 * I))}
    graph = helper.make_graph([loop], "looped", [helper.make_tensor_value_info("x", onnx.TensorProto.DOUBLE, [T, B, I])],
                              [helper.make_tensor_value_info("out", onnx.TensorProto.DOUBLE, [T, B, I])],
                              initializer=[numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)]))
    _assert_ort_is_numpy(model, {"x": RNG.standard_normal((T, B, I))})


@pytest.mark.parametrize("op, attrs, inputs", [("LSTM", {"direction": "bidirectional"}, ("b", "lens", "p", "h0")),
                                               ("GRU", {"layout": 1, "clip": 0.5}, ("b",)),
                                               ("RNN", {"direction": "reverse"}, ("lens",))])
def test_the_write_out_is_the_form_autodiff_writes(op, attrs, inputs, tmp_path):
    """One written-out form: the double model's Scans hold the cells ``passes.recurrent.write_out`` writes
    for gradients and ``gc.vmap`` (the default activations, which both write as ONNX ops), op for op; the file
    passes onnx's full check."""
    from graphc.passes.emit import Emitter
    from graphc.passes.recurrent import write_out

    model = _node_model(op, attrs, inputs)[0].proto
    written = doubles.lower_double(model)
    onnx.save(written, tmp_path / "written.onnx")
    onnx.checker.check_model(str(tmp_path / "written.onnx"), full_check=True)
    graph = ir.serde.deserialize_model(model).graph
    write_out(Emitter(graph, 21, "shared"), graph.node(0))
    bodies = lambda nodes: sorted(sorted(Counter(n.op_type for n in a.g.node).items()) for n in nodes
                                  if n.op_type == "Scan" for a in n.attribute if a.name == "body")
    want = bodies(ir.serde.serialize_graph(graph).node)
    assert len(want) == (2 if attrs.get("direction") == "bidirectional" else 1)
    assert bodies(written.graph.node) == want


def test_float32_and_models_without_them_are_left_alone():
    model32 = _node_model("LSTM", {"direction": "bidirectional"}, ("b", "lens"), dtype=onnx.TensorProto.FLOAT)[0].proto
    assert doubles.lower_double(model32) is model32
    plain = helper.make_model(helper.make_graph(
        [helper.make_node("Tanh", ["x"], ["y"])], "plain", [helper.make_tensor_value_info("x", 11, [2])],
        [helper.make_tensor_value_info("y", 11, [2])]), opset_imports=[helper.make_opsetid("", 21)])
    assert doubles.lower_double(plain) is plain
    model64 = _node_model("LSTM", {"direction": "bidirectional"}, ("b", "lens"))[0].proto
    written = doubles.lower_double(model64)
    kinds = Counter(n.op_type for n in written.graph.node)
    assert kinds["LSTM"] == 0 and kinds["Scan"] == 2
    assert Counter(n.op_type for n in model64.graph.node) == Counter({"LSTM": 1})  # the model is not changed


def test_cuda_leaves_the_forms_cudnn_runs():
    """On "cuda" a node cuDNN takes stays; one that onnxruntime would send back to the CPU is written out."""
    kept = _node_model("GRU", {"linear_before_reset": 1, "direction": "bidirectional"}, ("b",))[0].proto
    assert doubles.lower_double(kept, "cuda") is kept
    for op, attrs, inputs in [("GRU", {}, ()), ("LSTM", {}, ("p",)), ("RNN", {"clip": 1.0}, ()),
                              ("RNN", {"activations": ["Relu"]}, ()), ("LSTM", {"layout": 1}, ())]:
        model, _ = _node_model(op, attrs, inputs)
        assert not doubles_recurrent.cudnn_runs(model.proto.graph.node[0])
        assert op not in {n.op_type for n in doubles.lower_double(model.proto, "cuda").graph.node}


torch = pytest.importorskip("torch")


def _twin(kind: str, kwargs: dict):
    layer = getattr(gc.nn, kind)(I, H, **kwargs, dtype="float64")
    for p in layer.init_parameters(seed=1).parameters():
        p.data = p.numpy()  # pinned: a capture keeps them
    twin = getattr(torch.nn, kind)(I, H, **kwargs).double()
    twin.load_state_dict({k: torch.from_numpy(v) for k, v in layer.state_dict().items()})
    return layer, twin


MODULES = [
    ("LSTM", {"num_layers": 2, "bidirectional": True}),
    ("LSTM", {"batch_first": True}),
    ("GRU", {"num_layers": 2, "bidirectional": True, "batch_first": True}),
    ("GRU", {"bias": False}),
    ("RNN", {"bidirectional": True, "nonlinearity": "relu"}),
    ("RNN", {"num_layers": 2}),
]


@pytest.mark.parametrize("kind, kwargs", MODULES)
def test_float64_modules_match_torch_on_ort_cpu(kind, kwargs):
    layer, twin = _twin(kind, kwargs)
    x = RNG.standard_normal((B, T, I) if kwargs.get("batch_first") else (T, B, I))
    want_y, want_states = twin(torch.from_numpy(x))
    want_states = want_states if isinstance(want_states, tuple) else (want_states,)
    dims = ("N", "T", I) if kwargs.get("batch_first") else ("T", "N", I)  # the write-out takes symbolic sizes
    model = gc.capture(lambda x: _outputs(layer(x)), x=gc.spec(x.dtype, dims))
    got = gc.Session(model, backend="ort-cpu").run({"x": x})
    assert got["y"].dtype == np.float64
    np.testing.assert_allclose(got["y"], want_y.detach().numpy(), rtol=1e-12, atol=1e-13)
    for name, want in zip(("h", "c"), want_states):
        np.testing.assert_allclose(got[name], want.detach().numpy(), rtol=1e-12, atol=1e-13, err_msg=name)


def _outputs(result) -> dict:
    y, states = result
    states = states if isinstance(states, tuple) else (states,)
    return {"y": y, **dict(zip(("h", "c"), states))}


@pytest.mark.parametrize("kind, kwargs", [("LSTM", {"num_layers": 2, "bidirectional": True}),
                                          ("GRU", {"bidirectional": True}), ("RNN", {"num_layers": 2})])
@pytest.mark.parametrize("fed", [False, True], ids=["list", "tensor"])
def test_float64_packed_runs_match_torch_on_ort_cpu(kind, kwargs, fed):
    from torch.nn.utils import rnn as tr

    layer, twin = _twin(kind, kwargs)
    x, lengths = RNG.standard_normal((T, B, I)), [3, 5, 2]
    out, want_states = twin(tr.pack_padded_sequence(torch.from_numpy(x), lengths, enforce_sorted=False))
    want_y = tr.pad_packed_sequence(out, batch_first=True, padding_value=-2.0)[0]
    want_states = want_states if isinstance(want_states, tuple) else (want_states,)

    def fn(x, lens=None):
        y, states = layer(gr.pack_padded_sequence(x, lengths if lens is None else lens, enforce_sorted=False))
        return _outputs((gr.pad_packed_sequence(y, batch_first=True, padding_value=-2.0)[0], states))

    feeds = {"x": x, **({"lens": np.asarray(lengths, np.int64)} if fed else {})}
    model = gc.capture(fn, **feeds)
    got = gc.Session(model, backend="ort-cpu").run(feeds)
    np.testing.assert_allclose(got["y"], want_y.detach().numpy(), rtol=1e-12, atol=1e-13)
    for name, want in zip(("h", "c"), want_states):
        np.testing.assert_allclose(got[name], want.detach().numpy(), rtol=1e-12, atol=1e-13, err_msg=name)
