"""Long RNNs in reverse mode (``passes/autodiff/reverse_mode.py``): past ``MAX_UNROLLED_STEPS``, or
masked by ``sequence_lens``, each direction is a Scan whose gradient a backward Scan takes. Its
gradients equal torch.autograd's in float64 (both directions, initial states, ragged lengths) on
numpy and ort-cpu, and its graph runs the forward once, reads the cell's products off a tape and
sums the recurrence weight's gradient in one Gemm after the loop."""

from __future__ import annotations

import numpy as np
import onnx_ir as ir
import pytest
from onnx import helper
from onnx import numpy_helper as nh

import graphc as gc
from graphc.passes.autodiff import gradient_model
from graphc.passes.autodiff.recurrent import MAX_UNROLLED_STEPS

RNG = np.random.default_rng(0)
T, N, I, H = MAX_UNROLLED_STEPS + 6, 3, 3, 4
# torch's gate blocks in ONNX's order: LSTM i f g o -> i o f c, GRU r z n -> z r h
ORDER = {"LSTM": [0, 3, 1, 2], "GRU": [1, 0, 2], "RNN": [0]}


def _onnx_weights(layer, kind: str, directions: int) -> dict[str, np.ndarray]:
    """W, R, B of the ONNX op from the torch layer's parameters."""
    def blocks(t):
        return np.concatenate([np.split(t.detach().numpy(), len(ORDER[kind]))[k] for k in ORDER[kind]])

    sfx = ["_l0", "_l0_reverse"][:directions]
    p = dict(layer.named_parameters())
    return {"W": np.stack([blocks(p[f"weight_ih{s}"]) for s in sfx]),
            "R": np.stack([blocks(p[f"weight_hh{s}"]) for s in sfx]),
            "B": np.stack([np.concatenate([blocks(p[f"bias_ih{s}"]), blocks(p[f"bias_hh{s}"])]) for s in sfx])}


def _case(torch, kind: str, ragged: bool):
    """(the ONNX model: one bidirectional ``kind`` node with initial states, its outputs weighted
    into ``loss``; its values by name; torch's gradients of the same loss by the ONNX names)."""
    torch.manual_seed(0)
    layer = getattr(torch.nn, kind)(I, H, bidirectional=True).double()
    values = _onnx_weights(layer, kind, 2)
    values.update(x=RNG.standard_normal((T, N, I)), initial_h=RNG.standard_normal((2, N, H)))
    states = ["initial_h"] + (["initial_c"] if kind == "LSTM" else [])
    if kind == "LSTM":
        values["initial_c"] = RNG.standard_normal((2, N, H))
    lens = np.array([T, T - 9, 2] if ragged else [T] * N, np.int32)
    outputs = ["Y", "Y_h", "Y_c"][:3 if kind == "LSTM" else 2]
    weights = {o: RNG.standard_normal((T, 2, N, H) if o == "Y" else (2, N, H)) for o in outputs}

    leaves = {k: torch.tensor(v, requires_grad=True) for k, v in values.items()}  # the layer reads W, R, B
    weight = {}
    for d, s in enumerate(["_l0", "_l0_reverse"]):
        unblock = np.argsort(ORDER[kind])

        def torch_order(t, unblock=unblock):
            return torch.cat([torch.chunk(t, len(unblock))[k] for k in unblock])

        weight[f"weight_ih{s}"] = torch_order(leaves["W"][d])
        weight[f"weight_hh{s}"] = torch_order(leaves["R"][d])
        ih, hh = torch.chunk(leaves["B"][d], 2)
        weight[f"bias_ih{s}"], weight[f"bias_hh{s}"] = torch_order(ih), torch_order(hh)
    packed = torch.nn.utils.rnn.pack_padded_sequence(leaves["x"], torch.from_numpy(lens.astype(np.int64)),
                                                     enforce_sorted=False)
    init = tuple(leaves[s] for s in states) if kind == "LSTM" else leaves["initial_h"]
    y, last = torch.func.functional_call(layer, weight, (packed, init))
    y = torch.nn.utils.rnn.pad_packed_sequence(y, total_length=T)[0].reshape(T, N, 2, H).transpose(1, 2)
    got = {"Y": y, "Y_h": last[0] if kind == "LSTM" else last, "Y_c": last[1] if kind == "LSTM" else None}
    sum(((got[o] * torch.from_numpy(w)).sum() for o, w in weights.items())).backward()
    want = {k: t.grad.numpy() for k, t in leaves.items()}

    nodes = [helper.make_node(kind, ["x", "W", "R", "B", "sequence_lens", *states], outputs, hidden_size=H,
                              direction="bidirectional", **({"linear_before_reset": 1} if kind == "GRU" else {}))]
    for o in outputs:
        nodes += [helper.make_node("Mul", [o, f"{o}_weight"], [f"{o}_weighted"]),
                  helper.make_node("ReduceSum", [f"{o}_weighted"], [f"{o}_sum"], keepdims=0)]
    nodes.append(helper.make_node("Sum", [f"{o}_sum" for o in outputs], ["loss"]))
    inits = {k: v for k, v in values.items() if k != "x"} | {"sequence_lens": lens} | \
        {f"{o}_weight": w for o, w in weights.items()}
    graph = helper.make_graph(nodes, kind, [helper.make_tensor_value_info("x", 11, [T, N, I])],
                              [helper.make_tensor_value_info("loss", 11, [])],
                              [nh.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10), values, want


def _gradients(proto, values) -> gc.Model:
    return gc.Model(gradient_model(ir.serde.deserialize_model(proto), "loss", [k for k in values]))


@pytest.mark.parametrize("ragged", [False, True], ids=["full", "ragged"])
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_a_long_bidirectional_layer_gets_torchs_float64_gradients(kind, ragged):
    """Both directions, initial states, sequence_lens (ragged: rows ending at T, T-9 and 2):
    every input's gradient is torch.autograd's to 1e-10, on numpy and ort-cpu."""
    torch = pytest.importorskip("torch")
    proto, values, want = _case(torch, kind, ragged)
    grads = _gradients(proto, values)
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(grads, backend=backend).run({"x": values["x"]})
        for name in values:
            np.testing.assert_allclose(got[f"{name}_grad"], want[name], rtol=1e-10, atol=1e-10,
                                       err_msg=f"{backend} {name}")


def _backward_scans(graph: ir.Graph) -> list[ir.Node]:
    return [n for n in graph if n.op_type == "Scan" and "reverse_body" in n.attributes["body"].value.name]


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_the_forward_runs_once_and_the_backward_scan_recomputes_no_product(kind):
    """One taped Scan per direction (the taped copy took the forward's place) and one backward Scan
    per direction, no Loop: each backward body holds one product per recurrence weight block (dh: a
    MatMul, the LSTM's a Gemm as its cell's ``Gemm(h, R, x_t)``), no Gemm of transposed rows (the
    weight's gradient is one Gemm after it) and no Gather (the tapes, x and the dys
    are scanned inputs, the step's gradient of x a scan output in x's layout), no Sigmoid or Tanh
    (the gates' activations are taped too), and carries no accumulator (only the states'
    gradients); the taped forward stacks nothing the backward does not read."""
    torch = pytest.importorskip("torch")
    proto, values, _ = _case(torch, kind, ragged=False)
    graph = _gradients(proto, values).ir.graph
    backward = _backward_scans(graph)
    assert sum(n.op_type == "Scan" for n in graph) == 4 and len(backward) == 2
    assert not any(n.op_type in ("Loop", "Slice") for n in graph)
    states = 2 if kind == "LSTM" else 1
    products = 1 if kind == "LSTM" else 2  # GRU: r_zr and r_h
    for scan in backward:
        body = list(scan.attributes["body"].value)
        ops = [n.op_type for n in body]
        dh = [n for n in body if n.op_type in ("MatMul", "Gemm")]
        assert len(dh) == products and not {"Gather", "Sigmoid", "Tanh"} & set(ops), ops
        assert not any(a.name == "transA" and a.value for n in dh for a in n.attributes.values()), ops
        assert len(scan.inputs) - scan.attributes["num_scan_inputs"].value == states
    for scan in (n for n in graph if n.op_type == "Scan" and n not in backward):
        assert all(out.uses() for out in scan.outputs[states + 1:]), scan.outputs  # after the finals and Y: tapes



def _unreshaped(value: ir.Value) -> ir.Value:
    while value.producer() is not None and value.producer().op_type in ("Reshape", "Identity"):
        value = value.producer().inputs[0]
    return value


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_the_backward_scan_stacks_only_what_no_stack_holds_and_slices_x_for_nothing(kind):
    """The recurrence weight's Gemm reads the hidden states off the forward's tape and the gate
    gradients off x's stacked gradient: the backward body outputs no scanned input back (a
    re-stacked tape), in the forward direction no value twice (under Reshapes; the reverse
    direction stacks x's gradient in x's order, the reverse of the tapes'), and scans no input it
    reads only for its Shape (x's step, for the shape of its gradient: taken once off x outside)."""
    torch = pytest.importorskip("torch")
    proto, values, _ = _case(torch, kind, ragged=False)
    for scan in _backward_scans(_gradients(proto, values).ir.graph):
        body = scan.attributes["body"].value
        outputs = [_unreshaped(v) for v in body.outputs]
        assert not set(outputs) & set(body.inputs), outputs
        forward = set(scan.attributes["scan_input_directions"].value) == {1}  # read last step first
        assert len(set(outputs)) == len(outputs) or not forward, outputs
        for value in body.inputs:
            assert {use.node.op_type for use in value.uses()} - {"Shape"}, value

def test_a_while_loop_reads_its_products_off_the_tape_and_sums_the_weight_after_it():
    """``gc.while_loop`` for a number of steps fed at run time, ``h <- tanh(h @ w + b)``: the
    gradients of w, b and the initial h are torch.autograd's (float64, 1e-10, numpy and ort-cpu),
    and the backward Loop holds only the dh product and carries h's gradient alone."""
    torch = pytest.importorskip("torch")
    try:
        from torch_grad_util import _Wrap
    except ImportError:  # tests/ collected as a package
        from tests.torch_grad_util import _Wrap

    def cell(F, w, b, x, k):
        return gc.while_loop(lambda h, i: i < k, lambda h, i: (gc.tanh(h @ w + b), i + 1),
                             (x, gc.zeros((), dtype="int64")))[0]

    values = {"w": RNG.standard_normal((4, 4)) * 0.6, "b": RNG.standard_normal(4), "x": RNG.standard_normal((3, 4))}
    c, k = RNG.standard_normal((3, 4)), np.array(7, np.int64)
    grads = gc.grad(gc.capture(_Wrap(cell, values), c=c, k=k), "loss")
    loops = [n for n in grads.ir.graph if n.op_type == "Loop"]
    assert len(loops) == 2  # the taped forward and the backward
    backward = loops[-1]
    assert [n.op_type for n in backward.attributes["body"].value].count("MatMul") == 1
    assert "Gemm" not in [n.op_type for n in backward.attributes["body"].value]
    assert len(backward.inputs) == 3  # trip count, condition, h's gradient: no accumulator
    leaves = {name: torch.tensor(v, requires_grad=True) for name, v in values.items()}
    h = leaves["x"]
    for _ in range(int(k)):
        h = torch.tanh(h @ leaves["w"] + leaves["b"])
    (h * torch.from_numpy(c)).sum().backward()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(grads, backend=backend).run({"c": c, "k": k})
        for name, leaf in leaves.items():
            np.testing.assert_allclose(got[f"{name}_grad"], leaf.grad.numpy(), rtol=1e-10, atol=1e-10,
                                       err_msg=f"{backend} {name}")
