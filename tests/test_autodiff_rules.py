"""Gradient checks generated from the rule table: float64 finite differences on the numpy
backend, and numpy-vs-onnxruntime agreement of every gradient graph."""

from __future__ import annotations

import numpy as np
import onnx
import onnx_ir as ir
import pytest

import graphc

try:
    from autodiff_cases import CASES, GradCase, T, build, feeds, param_names, with_loss
except ImportError:  # tests/ collected as a package
    from tests.autodiff_cases import CASES, GradCase, T, build, feeds, param_names, with_loss
from graphc.passes.autodiff import RULES, gradient_model


def run_numpy(proto: onnx.ModelProto, feeds: dict) -> dict:
    """Run on graphc's numpy backend (it has a kernel for every op a gradient graph uses)."""
    from graphc.backends.numpy import NumpyBackend

    return NumpyBackend().prepare(proto).run(feeds)


def run_ort(proto: onnx.ModelProto, feeds: dict) -> dict:
    ort = pytest.importorskip("onnxruntime")
    sess = ort.InferenceSession(proto.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    return dict(zip(names, sess.run(None, feeds)))


def grad_proto(case: GradCase, dtype) -> tuple[onnx.ModelProto, dict[str, np.ndarray]]:
    """The case's gradient model (loss + <param>_grad outputs) and its float params."""
    fwd = build(case, dtype)
    outs = run_numpy(_with_outputs(fwd, case), feeds(case))
    model = with_loss(fwd, {k: v.shape for k, v in outs.items()}, case, dtype)
    wrt = param_names(case)
    gm = gradient_model(ir.serde.deserialize_model(model), "loss", wrt)
    proto = graphc.Model(gm).proto
    onnx.checker.check_model(proto, full_check=case.full_check)
    params = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer if t.name in wrt}
    return proto, params


def _with_outputs(model: onnx.ModelProto, case: GradCase) -> onnx.ModelProto:
    m = onnx.ModelProto()
    m.CopyFrom(model)
    del m.graph.output[:]
    for i in range(case.n_out):
        m.graph.output.append(onnx.helper.make_value_info(f"y{i}", onnx.TypeProto()))
    return m


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gradient_matches_finite_differences(case: GradCase):
    proto, params = grad_proto(case, np.float64)
    assert params, "case has no differentiable input"
    fed = feeds(case)
    out = run_numpy(proto, fed)
    rng = np.random.default_rng(2)
    eps = 1e-6
    for name, p in params.items():
        grad = out[f"{name}_grad"]
        assert grad.shape == p.shape and grad.dtype == p.dtype, name
        t = rng.standard_normal(p.shape)
        plus = run_numpy(proto, {**fed, name: p + eps * t})["loss"]
        minus = run_numpy(proto, {**fed, name: p - eps * t})["loss"]
        numeric = (plus - minus) / (2 * eps)
        analytic = float(np.sum(grad * t))
        np.testing.assert_allclose(analytic, numeric, rtol=case.rtol, atol=1e-6, err_msg=f"d loss / d {name}")


@pytest.mark.parametrize("case", [c for c in CASES if c.ort], ids=lambda c: c.id)
def test_gradient_graph_numpy_matches_onnxruntime(case: GradCase):
    proto, _ = grad_proto(case, np.float32)
    expected = run_numpy(proto, feeds(case))
    got = run_ort(proto, feeds(case))
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("case", [c for c in CASES if c.op == "Gather"], ids=lambda c: c.id)
def test_gather_by_a_permutation_needs_no_scatter(case: GradCase):
    """A constant index naming each position of its axis once: dy goes back by one Gather (the
    inverse permutation), where a repeated or partial index sums into zeros."""
    proto, _ = grad_proto(case, np.float64)
    ops = [n.op_type for n in proto.graph.node]
    assert ("ScatterElements" in ops) == ("permutation" not in case.tag), ops
    assert ops.count("Gather") == (2 if "permutation" in case.tag else 1), ops



# gradients that sum into positions an index may repeat (a reducing ScatterElements)
SCATTER_ADD_CASES = ["Gather-embedding", "GatherElements", "GatherND-repeated_tuples", "MaxPool-overlap_indices",
                     "SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss", "GridSample"]


@pytest.mark.parametrize("case", [c for c in CASES if c.id in SCATTER_ADD_CASES], ids=lambda c: c.id)
def test_float16_scatter_add_gradients_run_on_onnxruntime(case: GradCase):
    """onnxruntime's CPU provider has no float16 ScatterElements with reduction='add': the sum
    runs in float32. The float16 gradient, on numpy and onnxruntime, is the float64 one (which
    the finite-difference test checks) to float16's precision."""
    proto, params = grad_proto(case, np.float16)
    want = run_numpy(grad_proto(case, np.float64)[0], feeds(case))
    for got in (run_numpy(proto, feeds(case)), run_ort(proto, feeds(case))):
        for name in params:
            grad, ref = got[f"{name}_grad"], want[f"{name}_grad"]
            assert grad.dtype == np.float16, name
            np.testing.assert_allclose(grad, ref, rtol=2e-2, atol=1e-2 * np.abs(ref).max(), err_msg=name)

def test_every_rule_has_a_generated_case():
    covered = {c.op for c in CASES}
    assert set(RULES) - covered == set()


def test_every_gradient_node_is_ai_onnx():
    for case in CASES:
        proto, _ = grad_proto(case, np.float64)
        assert {n.domain for n in proto.graph.node} <= {"", "ai.onnx"}, case.id


def _valid_at(case: GradCase, opset: int) -> bool:
    model = build(case)
    model.opset_import[0].version = opset
    try:
        if onnx.defs.get_schema(case.op, opset).deprecated:
            return False
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception:  # noqa: BLE001  (InferenceError, or no schema at that opset)
        return False
    return True


OPSET17_CASES = [c for c in CASES if c.opset == 21 and _valid_at(c, 17)]


@pytest.mark.parametrize("case", OPSET17_CASES, ids=lambda c: c.id)
def test_gradient_graph_follows_the_model_opset(case: GradCase):
    """At opset 17 the gradient uses that opset's forms (ReduceMean axes as an attribute, ...):
    the full checker accepts it, and the gradient still matches finite differences."""
    from dataclasses import replace

    test_gradient_matches_finite_differences(replace(case, opset=17))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_gradient_masks_exactly_where_the_output_is_positive(dtype):
    """d sum(relu(x) * c) / dx = c where x > 0, else 0 (at 0 too, as PyTorch's threshold_backward):
    in float32 by a HardSigmoid of y scaled past 1 (one pass), in float64 by Greater and Cast;
    exact for the smallest normal float32, the largest, zeros and negatives, on numpy and ort."""
    import onnx.helper as oh

    tiny, huge = np.finfo(np.float32).tiny, np.finfo(np.float32).max
    x = np.array([[-1.0, 0.0, tiny, 2 * tiny, 1e-30, 0.5, 3.0, 1e30, huge, -huge]], dtype)
    c = np.random.default_rng(0).normal(size=x.shape).astype(dtype)
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    nodes = [oh.make_node("Relu", ["x"], ["y"]), oh.make_node("Mul", ["y", "c"], ["yc"]),
             oh.make_node("ReduceSum", ["yc"], ["loss"], keepdims=0)]
    graph = oh.make_graph(nodes, "relu", [oh.make_tensor_value_info("x", elem, list(x.shape))],
                          [oh.make_tensor_value_info("loss", elem, [])], [onnx.numpy_helper.from_array(c, "c")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", 17)])
    proto = graphc.Model(gradient_model(ir.serde.deserialize_model(model), "loss", ["x"])).proto
    assert ("HardSigmoid" in {n.op_type for n in proto.graph.node}) == (dtype == np.float32)
    for run in (run_ort, run_numpy):
        np.testing.assert_array_equal(run(proto, {"x": x})["x_grad"], np.where(x > 0, c, 0), err_msg=run.__name__)


def _conv_weight_grad_of_squares(x, w, strides=(1, 1), dilations=(1, 1), pads=(0, 0, 0, 0)):
    """numpy, float64: d sum(conv(x, w)**2) / dw, window by window (an oracle for the lowerings)."""
    x, w = x.astype(np.float64), w.astype(np.float64)
    xp = np.pad(x, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    kh, kw = w.shape[2:]
    oh = (xp.shape[2] - dilations[0] * (kh - 1) - 1) // strides[0] + 1
    ow = (xp.shape[3] - dilations[1] * (kw - 1) - 1) // strides[1] + 1
    win = np.empty((x.shape[0], x.shape[1], kh, kw, oh, ow))
    for i in range(kh):
        for j in range(kw):
            r, c = i * dilations[0], j * dilations[1]
            win[:, :, i, j] = xp[:, :, r:r + strides[0] * (oh - 1) + 1:strides[0], c:c + strides[1] * (ow - 1) + 1:strides[1]]
    y = np.einsum("ncijhw,mcij->nmhw", win, w)
    return np.einsum("nmhw,ncijhw->mcij", 2 * y, win)


def _conv_squares_weight_grad(w: np.ndarray, x_dims: list, attrs: dict, opset: int = 17) -> onnx.ModelProto:
    """The gradient model of sum(conv(x, w, **attrs)**2) with respect to w (output ``w_grad``),
    x float32 of ``x_dims`` (symbolic dims by name): the conv-lowering tests' model."""
    import onnx.helper as oh

    conv = oh.make_node("Conv", ["x", "w"], ["y"], **attrs)
    loss = [oh.make_node("Mul", ["y", "y"], ["sq"]), oh.make_node("ReduceSum", ["sq"], ["loss"], keepdims=0)]
    graph = oh.make_graph([conv, *loss], "conv", [oh.make_tensor_value_info("x", onnx.TensorProto.FLOAT, x_dims)],
                          [oh.make_tensor_value_info("loss", onnx.TensorProto.FLOAT, [])],
                          [onnx.numpy_helper.from_array(w, "w")])
    model = oh.make_model(graph, opset_imports=[oh.make_opsetid("", opset)])
    return graphc.Model(gradient_model(ir.serde.deserialize_model(model), "loss", ["w"])).proto


@pytest.mark.parametrize("attrs", [{"pads": [1, 1, 1, 1]}, {"strides": [2, 2], "pads": [1, 0, 0, 1]},
                                   {"dilations": [2, 1], "strides": [1, 2], "pads": [2, 1, 0, 1]}])
def test_gathered_conv_weight_gradient_on_a_symbolic_batch(monkeypatch, attrs):
    """A dense Conv's dW from the batch-innermost input gathered at once (up to ``GATHER_COLS``
    column values), past that bound a channel at a time (one channel's columns, at a typical
    batch of 16, within ``GATHER_CHUNK``), and with both bounds at 0 the im2col of window Slices,
    with a batch known only at run time: each equals the window-by-window sum in float64, at
    batches 1, 3 and 5, on onnxruntime and numpy. (Finite differences check it on the Conv
    cases' static shapes.)"""
    from graphc.passes.autodiff import rules_nn

    w = np.random.default_rng(0).normal(size=(4, 3, 3, 3)).astype(np.float32)
    strides, dilations, pads = attrs.get("strides", (1, 1)), attrs.get("dilations", (1, 1)), attrs["pads"]
    out = [(d + pads[i] + pads[i + 2] - dilations[i] * 2 - 1) // strides[i] + 1 for i, d in enumerate((9, 8))]
    channel = 9 * out[0] * out[1] * 16  # one input channel's columns at the typical batch
    for bounds, gathers in [((1 << 23, 0), 1), ((0, channel), 3), ((0, 0), 0)]:
        monkeypatch.setattr(rules_nn, "GATHER_COLS", bounds[0])
        monkeypatch.setattr(rules_nn, "GATHER_CHUNK", bounds[1])
        proto = _conv_squares_weight_grad(w, ["N", 3, 9, 8], attrs)
        assert [n.op_type for n in proto.graph.node].count("Gather") == gathers
        for batch in (1, 3, 5):
            x = np.random.default_rng(batch).normal(size=(batch, 3, 9, 8)).astype(np.float32)
            expected = _conv_weight_grad_of_squares(x, w, strides, dilations, pads)
            for run in (run_ort, run_numpy):
                np.testing.assert_allclose(run(proto, {"x": x})["w_grad"], expected, rtol=1e-4, atol=1e-3,
                                           err_msg=f"{gathers} Gathers, batch {batch} {run.__name__}")


@pytest.mark.parametrize("attrs", [{"pads": [3, 1, 0, 4], "strides": [1, 2]},  # whole windows in the padding
                                   {"pads": [0, 2, 2, 0], "dilations": [2, 1]}, {"pads": [0, 0, 0, 0]}])
def test_gathered_conv_weight_gradient_reads_the_padding_from_one_zero_row(attrs):
    """The gathered dW's batch-innermost input, [C, P, N], is padded by one zero row per channel
    ([C, P + 1, N]), which every tap reading the padding gathers, not by the padded grid; without
    pads nothing is padded. Equal to the window-by-window sum in float64 on onnxruntime and numpy,
    windows lying wholly in the padding included."""
    rng = np.random.default_rng(0)
    w = rng.normal(size=(4, 3, 3, 3)).astype(np.float32)
    x = rng.normal(size=(2, 3, 6, 5)).astype(np.float32)
    proto = _conv_squares_weight_grad(w, list(x.shape), attrs)
    nodes = {n.output[0]: n for n in proto.graph.node}
    (gather,) = [n for n in proto.graph.node if n.op_type == "Gather"]
    pad = nodes[gather.input[0]]
    if any(attrs["pads"]):
        assert pad.op_type == "Pad"
        assert onnx.numpy_helper.to_array(nodes[pad.input[1]].attribute[0].t).tolist() == [0, 0, 0, 0, 1, 0]
    else:
        assert "Pad" not in {n.op_type for n in proto.graph.node}
    expected = _conv_weight_grad_of_squares(x, w, attrs.get("strides", (1, 1)), attrs.get("dilations", (1, 1)),
                                            attrs["pads"])
    for run in (run_ort, run_numpy):
        np.testing.assert_allclose(run(proto, {"x": x})["w_grad"], expected, rtol=1e-4, atol=1e-3, err_msg=run.__name__)


def _grouped_weight_grad_of_squares(x, w, group, strides, dilations, pads):
    """numpy, float64: d sum(conv(x, w, group)**2) / dw: each group a dense conv of its own
    channels (``_conv_weight_grad_of_squares``); a depthwise conv's group is one channel."""
    ci, co = w.shape[1], w.shape[0] // group
    return np.concatenate([_conv_weight_grad_of_squares(x[:, g * ci:(g + 1) * ci], w[g * co:(g + 1) * co], strides,
                                                        dilations, pads) for g in range(group)])


@pytest.mark.parametrize("attrs", [{"pads": [1, 1, 1, 1]}, {"strides": [2, 2], "pads": [2, 0, 1, 2]},
                                   {"dilations": [2, 1], "strides": [1, 3], "pads": [2, 1, 0, 1]}])
def test_depthwise_conv_weight_gradient_per_image_and_on_a_symbolic_batch(attrs):
    """A depthwise Conv's dW with a static batch of 2, output of 64+ pixels (one Conv whose groups
    are the images' channels), and with the batch known only at run time (at stride 1 the row
    products, else the Conv over x with batch and channels swapped), with strides that do not
    divide evenly, dilations and uneven pads: each equals the per-channel window-by-window sum
    in float64, on onnxruntime and numpy."""
    w = np.random.default_rng(0).normal(size=(3, 1, 3, 3)).astype(np.float32)
    for batch_dim in (2, "N"):
        proto = _conv_squares_weight_grad(w, [batch_dim, 3, 17, 18], {"group": 3, **attrs})
        groups = [a.i for n in proto.graph.node if n.op_type == "Conv" for a in n.attribute if a.name == "group"]
        assert (6 in groups) == (batch_dim == 2)  # the per-image Conv: 2 images x 3 channels
        for batch in ((2,) if batch_dim == 2 else (1, 3)):
            x = np.random.default_rng(batch).normal(size=(batch, 3, 17, 18)).astype(np.float32)
            expected = _grouped_weight_grad_of_squares(x, w, 3, attrs.get("strides", (1, 1)),
                                                       attrs.get("dilations", (1, 1)), attrs["pads"])
            for run in (run_ort, run_numpy):
                np.testing.assert_allclose(run(proto, {"x": x})["w_grad"], expected, rtol=1e-4, atol=1e-3,
                                           err_msg=f"batch {batch_dim}={batch} {run.__name__}")


@pytest.mark.parametrize(("kernel", "attrs"), [(3, {"pads": [1, 1, 1, 1]}), (5, {"pads": [2, 1, 0, 2]}),
                                               (3, {"dilations": [2, 3], "pads": [2, 0, 1, 3]}), (3, {})])
def test_depthwise_conv_weight_gradient_as_row_products(monkeypatch, kernel, attrs):
    """A stride-1 depthwise Conv's dW from a batch of 4 (or a symbolic one) on the CPU: dy's
    columns spread per kernel column by a 0/1 MatMul, times x's rows, the images summed and the
    taps read off the diagonals; past ``ROWS_CHUNK`` values a few images at a time (a batch of 5
    in chunks of 2, 2 and 1), a symbolic batch then another lowering, as below opset 11 (whose
    Pad takes its pads as an attribute): with uneven pads, none, and dilations, on a map that is
    not square, equal to the per-channel window-by-window sum in float64, on onnxruntime and
    numpy."""
    from graphc.passes.autodiff import rules_nn

    w = np.random.default_rng(0).normal(size=(3, 1, kernel, kernel)).astype(np.float32)
    out = (11 + sum(attrs.get("pads", [0] * 4)[::2]) - attrs.get("dilations", (1, 1))[0] * (kernel - 1))
    two_images = 2 * rules_nn._rows_per_image(3, kernel, out, (11, 14))
    for batch_dim, batches, bound, products, opset in ((4, (4,), 1 << 23, 2, 17), ("N", (1, 3), 1 << 23, 2, 17),
                                                        (5, (5,), two_images, 6, 17), ("N", (3,), two_images, 0, 17),
                                                        (4, (4,), 1 << 23, 0, 10)):  # Pad-2: no row products
        monkeypatch.setattr(rules_nn, "ROWS_CHUNK", bound)
        proto = _conv_squares_weight_grad(w, [batch_dim, 3, 11, 14], {"group": 3, **attrs}, opset)
        ops = [n.op_type for n in proto.graph.node]
        assert ops.count("MatMul") == products, ops  # two a chunk of images
        for batch in batches:
            x = np.random.default_rng(batch).normal(size=(batch, 3, 11, 14)).astype(np.float32)
            expected = _grouped_weight_grad_of_squares(x, w, 3, (1, 1), attrs.get("dilations", (1, 1)),
                                                       attrs.get("pads", [0] * 4))
            for run in (run_ort, run_numpy):
                np.testing.assert_allclose(run(proto, {"x": x})["w_grad"], expected, rtol=1e-4, atol=1e-3,
                                           err_msg=f"batch {batch_dim}={batch} {run.__name__}")


@pytest.mark.parametrize(("kernel", "stride", "side"), [(3, 2, 16), (5, 2, 16), (3, 3, 23)])
def test_strided_depthwise_weight_gradient_reaches_no_tap_past_the_kernel(kernel, stride, side):
    """A strided depthwise Conv's dW as one Conv grouped by image and channel (a static batch,
    64+ output pixels) is padded at the end just enough to reach the kernel's last tap: the
    forward's pads (k//2 each side) would reach one tap further, computed and then cut off by a
    Slice. Equal to the window-by-window sum in float64."""
    pad = kernel // 2
    w = np.random.default_rng(0).normal(size=(3, 1, kernel, kernel)).astype(np.float32)
    proto = _conv_squares_weight_grad(w, [2, 3, side, side], {"group": 3, "strides": [stride] * 2, "pads": [pad] * 4})
    ops = [n.op_type for n in proto.graph.node]
    assert "Slice" not in ops and ops.count("Conv") == 2  # the forward and the per-image dW
    x = np.random.default_rng(1).normal(size=(2, 3, side, side)).astype(np.float32)
    expected = _grouped_weight_grad_of_squares(x, w, 3, [stride] * 2, (1, 1), [pad] * 4)
    for run in (run_ort, run_numpy):
        np.testing.assert_allclose(run(proto, {"x": x})["w_grad"], expected, rtol=1e-4, atol=1e-3, err_msg=run.__name__)


@pytest.mark.parametrize("attrs", [{"pads": [1, 1, 1, 1]}, {"strides": [2, 2], "pads": [1, 0, 0, 1]},
                                   {"dilations": [2, 1], "strides": [1, 2], "pads": [2, 1, 0, 1]}])
def test_grouped_conv_weight_gradient_gathered_per_group(monkeypatch, attrs):
    """A grouped Conv's dW (3 channels a group, RegNet's kind) from a batch of 4 or more (a
    symbolic batch counts as 16): the gathered columns of all groups and one MatMul batched over
    the groups; past ``GATHER_COLS``, a group at a time (its columns within ``GATHER_CHUNK``), the
    groups' products stacked; at a batch of 2 the Conv over swapped axes. Each equals the per-group window-by-window sum in
    float64, with strides that do not divide evenly, dilations and uneven pads, on onnxruntime and
    numpy."""
    from graphc.passes.autodiff import rules_nn

    w = np.random.default_rng(0).normal(size=(6, 3, 3, 3)).astype(np.float32)  # 2 groups of 3 -> 3
    strides, dilations, pads = attrs.get("strides", (1, 1)), attrs.get("dilations", (1, 1)), attrs["pads"]
    out = [(d + pads[i] + pads[i + 2] - dilations[i] * 2 - 1) // strides[i] + 1 for i, d in enumerate((9, 8))]
    group_cols = 3 * 9 * out[0] * out[1]  # one group's columns an image
    cases = [(4, (4,), 1 << 23, 0, 1), ("N", (1, 4), 1 << 23, 0, 1), (2, (2,), 1 << 23, 0, 0),
             (5, (5,), 0, 5 * group_cols, 2), ("N", (3,), 0, 16 * group_cols, 2), (5, (5,), 0, 5 * group_cols - 1, 0)]
    for batch_dim, batches, cols_bound, chunk_bound, gathers in cases:
        monkeypatch.setattr(rules_nn, "GATHER_COLS", cols_bound)
        monkeypatch.setattr(rules_nn, "GATHER_CHUNK", chunk_bound)
        proto = _conv_squares_weight_grad(w, [batch_dim, 6, 9, 8], {"group": 2, **attrs})
        ops = [n.op_type for n in proto.graph.node]
        assert (ops.count("Gather"), ops.count("MatMul")) == (gathers, gathers), batch_dim
        for batch in batches:
            x = np.random.default_rng(batch).normal(size=(batch, 6, 9, 8)).astype(np.float32)
            expected = _grouped_weight_grad_of_squares(x, w, 2, strides, dilations, pads)
            for run in (run_ort, run_numpy):
                np.testing.assert_allclose(run(proto, {"x": x})["w_grad"], expected, rtol=1e-4, atol=1e-3,
                                           err_msg=f"batch {batch_dim}={batch} {run.__name__}")


@pytest.mark.parametrize(("strides", "chunks"), [([1, 1], 3), ([2, 1], 2)])
def test_conv_weight_gradient_in_batch_chunks(monkeypatch, strides, chunks):
    """With the gathered columns off (as on CUDA), past ``IM2COL_CHUNK`` column values a static
    batch's dW is taken by the window Slices a few images at a time, each chunk's Gemm adding
    into the last one's: still the gradient, on numpy and onnxruntime. Two images' columns per
    chunk here: batches 5 -> 2, 2, 1 and 3 -> 2, 1."""
    from dataclasses import replace

    from graphc.passes.autodiff import rules_nn

    batch = 2 * chunks - 1
    case = GradCase("Conv", [T((batch, 3, 6, 6)), T((4, 3, 3, 3)), T((4,))], {"pads": [1, 1, 1, 0], "strides": strides},
                    tag="im2col_chunks")
    out_pixels = ((6 + 2 - 3) // strides[0] + 1) * (6 + 1 - 3 + 1)
    monkeypatch.setattr(rules_nn, "GATHER_COLS", 0)
    monkeypatch.setattr(rules_nn, "GATHER_CHUNK", 0)
    monkeypatch.setattr(rules_nn, "IM2COL_CHUNK", 2 * 3 * 9 * out_pixels)
    proto, _ = grad_proto(case, np.float64)
    ops = [n.op_type for n in proto.graph.node]
    assert ops.count("Gemm") == chunks and "Gather" not in ops
    test_gradient_matches_finite_differences(case)
    test_gradient_graph_numpy_matches_onnxruntime(replace(case, ort=True))
    # one image's columns past a chunk: the Conv with batch and channels swapped (memory-bound)
    monkeypatch.setattr(rules_nn, "IM2COL_CHUNK", 3 * 9 * out_pixels - 1)
    proto, _ = grad_proto(case, np.float64)
    assert "Gemm" not in {n.op_type for n in proto.graph.node}
    assert sum(n.op_type == "Conv" for n in proto.graph.node) == 2  # the forward and dW


@pytest.mark.parametrize(("strides", "channels"), [([1, 1], 1), ([2, 1], 2)])
def test_gathered_conv_weight_gradient_in_channel_runs(monkeypatch, strides, channels):
    """Past ``GATHER_COLS`` column values the gathered dW takes ``channels`` input channels at a
    time (their columns within ``GATHER_CHUNK``), all read from the one batch-innermost input,
    each run's Gemm making its own columns of dW: still the gradient, by finite differences and
    on numpy and onnxruntime. 3 channels -> runs of 1, 1, 1 or 2, 1."""
    from dataclasses import replace

    from graphc.passes.autodiff import rules_nn

    case = GradCase("Conv", [T((3, 3, 6, 6)), T((4, 3, 3, 3)), T((4,))], {"pads": [1, 1, 1, 0], "strides": strides},
                    tag="gathered_runs")
    out_pixels = ((6 + 2 - 3) // strides[0] + 1) * (6 + 1 - 3 + 1)
    monkeypatch.setattr(rules_nn, "GATHER_COLS", 3 * 3 * 9 * out_pixels - 1)
    monkeypatch.setattr(rules_nn, "GATHER_CHUNK", channels * 3 * 9 * out_pixels)
    proto, _ = grad_proto(case, np.float64)
    ops = [n.op_type for n in proto.graph.node]
    runs = -(-3 // channels)
    # Transposes: x and dy batch-innermost, and the dW^T the Gemms make back to dW
    assert ops.count("Gemm") == ops.count("Gather") == runs and ops.count("Transpose") == 3
    test_gradient_matches_finite_differences(case)
    test_gradient_graph_numpy_matches_onnxruntime(replace(case, ort=True))


@pytest.mark.parametrize(("attrs", "message"), [
    ({"strides": [2, 3], "output_shape": [10, 14]}, r"output_shape \[10, 14\] needs static spatial dims of at least "
                                                    r"it, the size without pads; got \[9, 14\]"),
    # the output (input x strides) wider than the unpadded ConvTranspose: negative pads
    ({"auto_pad": "SAME_UPPER", "strides": [2, 3]}, r"auto_pad='SAME_UPPER' \(output dims \[8, 15\]\) needs static "
                                                    r"spatial dims of at least it, the size without pads; got \[9, 14\]"),
])
def test_conv_transpose_settings_without_a_gradient_are_named(attrs, message):
    case = GradCase("ConvTranspose", [T((1, 2, 4, 5)), T((2, 3, 3, 2))], attrs)
    with pytest.raises(graphc.GraphError, match=message):
        grad_proto(case, np.float64)
