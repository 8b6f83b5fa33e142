"""Alternative gradient lowerings side by side on onnxruntime CPU: the figures in the rules' comments.

    .venv/bin/python scripts/bench_lowerings.py [--threads 1] [--rounds 15] [--only bn,silu,...]
        [--device cpu|cuda]

``--device cuda`` runs them on onnxruntime's CUDA provider, each variant captured and replayed as
a CUDA graph (as ``Trainer(cuda_graph=True)`` runs a step), so a run times kernels, not launches.

Each case builds small ONNX graphs that compute the same thing in different ops (checked to
agree), binds their inputs once and times them in turn (median ms). onnxruntime's intra-op
spinning is turned off: two sessions timed in turn on a small machine otherwise slow each
other (a 12.6 MB Add measured 11.4 instead of 1.7 ms). Cases:

- ``bn``: training BatchNorm forward + backward, as ``rules_norm`` writes it (affine parts by an
  inference-mode BatchNormalization of the centred input) vs the textbook form (xhat written).
- ``bn_stats``: a per-channel sum over (N, H, W), as BatchNorm's statistics and gradient sums
  need it: one ReduceSum over axes (0, 2, 3) (cuDNN's reduction on CUDA) vs [N, C, H*W] summed
  over axis 2 then 0 (reductions over a contiguous last or first axis) vs a GEMV against ones.
- ``bn_sums``: a per-channel sum over (N, H, W) of a product (Mul + ReduceSum vs a batched dot
  MatMul vs Einsum) and of a square (vs ReduceSumSquare, GlobalLpPool).
- ``bn_passes``: a training BatchNorm's passes, each vs one pass fewer: the backward's two sums
  vs one over a Concat, its dx with dy * k vs k folded away, the forward's mean and variance vs
  E[x] and E[x^2] in one pass.
- ``silu``: x * Sigmoid(x) forward + backward, SiLU's whole gradient vs the Mul and Sigmoid rules.
- ``gelu``: exact GELU as torch.onnx writes it (x * (1 + Erf(x/sqrt 2)) * 0.5) forward +
  backward: its whole gradient from x and 1 + erf, the same recomputing erf, the Mul, Add, Erf
  and Div rules (which keep x/sqrt 2 too), exp(-x^2/2) as 1 / exp(u^2), and that from the
  output's own gradient with Phi as HardSigmoid(erf).
- ``layer_norm``: LayerNormalization forward + backward from its Mean and InvStdDev outputs:
  the textbook dx vs dx folded into per-row affine terms (by Mul + Add or a BatchNormalization).
- ``leading_sum``: a bias's gradient, the sum over leading axes: ReduceSum vs a GEMV.
- ``hardswish``: HardSwish forward + backward: dy or the slope picked by Wheres vs the slope as
  HardSigmoid plus x/6 inside [-3, 3] (a Cast mask, or x less its Shrink).
- ``relu``: ReLU forward + backward: dy * Cast(y > 0), Where, dy * Sign(y), dy * HardSigmoid(y * FLT_MAX).
- ``bn_affine``: a training BatchNorm's per-channel affine of the centred input, alone, before a
  Relu, a residual Add (and a Relu), or added to dy * k: inference BatchNormalization vs a 1x1
  Conv of one channel a group, into which onnxruntime fuses the Relu and the Add.
- ``max_pool``: ResNet's 3x3 stride-2 pool forward + backward: the Indices output and
  ScatterElements vs a forward without Indices and each window's first maximum found per tap.
- ``pointwise_dx``: a 1x1 Conv's dx: Gemm by the weight read transposed, Conv by the
  transposed weight, ConvTranspose.
- ``pointwise_dw``: a 1x1 Conv's dW: Einsum vs a MatMul per image summed vs channel-major + Gemm.
- ``strided_pointwise_dx``: a stride-2 1x1 Conv's dx: ConvTranspose vs Conv + zero Pad.
- ``depthwise_dw``: a depthwise Conv's dW: the Conv with batch and channels swapped vs one sum
  per kernel tap, over the whole batch or a few images at a time, vs one Conv grouped by image
  and channel, vs dy's columns spread per kernel column times x's rows (two MatMuls).
- ``dense_dw``: a dense kxk Conv's dW by im2col and one GEMM: the window slices taken one spatial
  axis at a time vs all at once (vs, stride 1, each tap a run of whole padded rows) vs the columns
  gathered from the batch-innermost input in one Gather, its padding one zero row or the padded grid.
- ``conv_dx``: a kxk Conv's dx (depthwise, grouped, dense; stride 1, and depthwise stride 2):
  ConvTranspose vs a Conv by the weight flipped in space, each group's channel axes swapped (for
  stride 2, dy spread over the input grid with zeros first).
- ``gathered_conv``: a dense stride-1 3x3 Conv on maps of 49 to 256 pixels and its dx: Conv and
  ConvTranspose vs the columns gathered from the batch-innermost input times the weight.
- ``large_dw``: a dense kxk Conv's dW on large maps: the Conv over x with batch and channels
  swapped vs im2col + GEMM a few images at a time, adding up, vs one GEMM per kernel tap, vs the
  whole batch's columns gathered at once.
- ``grouped_conv``: a grouped 3x3 Conv's forward and dx: Conv, ConvTranspose vs gathered columns
  times the weight batched over the groups, and (stride 2) vs sub-pixel phases.
- ``batch_dw``: a dense 3x3 Conv's dW at ResNet's and the stems' shapes, batches 2, 8 and 32: the
  gathered columns vs the Conv over swapped axes, on the generic and on the NCHWc kernels.
- ``grouped_dw``: a grouped 3x3 Conv's dW (group width 8): the Conv with each group's channels as
  its batch and dy as its kernel vs the gathered columns into one MatMul batched over the groups.
- ``reaching_pads``: a stride-2 depthwise Conv's dW as one Conv grouped by image and channel: the
  forward's end pads vs end pads that reach the kernel's last tap and no further; vs the row
  products of ``depthwise_dw``.
- ``row_conv``: a depthwise Conv's forward and dx: Conv and ConvTranspose vs the same two
  products, w's taps banded per channel.
- ``depthwise_product``: a depthwise Conv on a small map as a per-channel dense product, its
  forward and gradients: Einsum vs Transposes and a MatMul batched over the channels.
- ``nchwc``: a Conv whose weight is an input, on onnxruntime's generic kernel vs its NCHWc
  kernels with the weight reordered in the graph (``graphc.backends.nchwc``).
- ``unfold``: ``F.unfold`` and ``F.fold`` forward + ``gc.grad`` backward (graphc's graphs): a Conv
  (ConvTranspose) grouped by channel by a one-hot kernel, as ``graphc/dsl/ops_fold.py`` lowers them,
  vs the image as N*C one-channel images, vs Pad and strided Slices stacked (each tap's block
  Padded into place and summed).
- ``int_power``: ``a ** b`` of int32/int64 Tensors [1M] by a Tensor power (graphc's graphs), small (< 8) and
  full-range powers: ONNX Pow (the baseline; through double, so not exact and not checked), the square and
  multiply as fixed masked steps, one per bit of the dtype, vs a Loop while the largest power has bits left
  (each step's low bit by Mod or BitwiseAnd, the power halved by Div or a uint BitShift), and torch's pow
  timed in the same rounds; every checked variant equals torch's.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import onnx
import onnxruntime as ort
from onnx import helper as h

RNG = np.random.default_rng(0)


def const(name: str, value, dtype=np.float32) -> onnx.NodeProto:
    return h.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(np.asarray(value, dtype), name))


def ints(name: str, value) -> onnx.NodeProto:
    return const(name, value, np.int64)


def session(nodes, feeds: dict[str, np.ndarray], outputs: list[str], args: argparse.Namespace) -> ort.InferenceSession:
    """A session of ``nodes`` (or of a whole model: graphc's own graphs) with ``feeds`` as inputs."""
    if isinstance(nodes, onnx.ModelProto):
        model = nodes
    else:
        graph = h.make_graph(nodes, "case", [h.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape)
                                             for k, v in feeds.items()],
                             [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, None) for n in outputs])
        domains = [h.make_opsetid(d, 1) for d in sorted({n.domain for n in nodes} - {""})]  # onnxruntime's own ops
        model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17), *domains], ir_version=8)
    options = ort.SessionOptions()
    options.intra_op_num_threads = args.threads
    options.log_severity_level = 3
    options.enable_mem_pattern = False  # as the Trainer runs train_step
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    if args.device == "cpu":
        return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    # as Trainer(cuda_graph=True) runs a step: captured once, replayed (kernel time, no launches)
    cuda = {"enable_cuda_graph": "1", "use_tf32": "0"}
    created = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=[("CUDAExecutionProvider", cuda), "CPUExecutionProvider"])
    if "CUDAExecutionProvider" not in created.get_providers():
        sys.exit(f"no CUDA provider in this session (it got {created.get_providers()})")
    return created


def compare(label: str, variants: dict[str, list], feeds: dict[str, np.ndarray], outputs: list[str],
            args: argparse.Namespace, unchecked: tuple[str, ...] = (), others: dict[str, Callable] | None = None
            ) -> None:
    """Median ms of each variant, run in turn; their outputs must agree (integer ones exactly), but the
    ``unchecked`` variants'. Inputs and outputs stay bound on the device (IOBinding), so a run times the case's
    kernels alone. ``others`` (name: a callable) are timed in the same rounds (torch's op)."""
    sessions = {k: session(v, feeds, outputs, args) for k, v in variants.items()}
    bound = {k: bind(s, feeds, outputs, args.device) for k, s in sessions.items()}
    results = {}
    sizing = ort.RunOptions()  # a first run that no CUDA graph captures: it sizes the outputs
    sizing.add_run_config_entry("gpu_graph_id", "-1")
    for k, s in sessions.items():
        s.run_with_iobinding(bound[k], sizing if args.device == "cuda" else None)
        results[k] = bound[k].get_outputs()
        for name, value in zip(outputs, results[k]):  # the same output buffers every run
            bound[k].bind_ortvalue_output(name, value)
        for _ in range(2):  # with CUDA graphs: the capture, its first replay
            s.run_with_iobinding(bound[k])
        results[k] = [v.numpy() for v in results[k]]
    checked = [k for k in results if k not in unchecked]
    for k in checked:
        for a, b in zip(results[checked[0]], results[k]):
            if a.dtype.kind in "iub":
                np.testing.assert_array_equal(b, a, err_msg=f"{label}: {k}")
            else:
                np.testing.assert_allclose(b, a, rtol=1e-3, atol=1e-3, err_msg=f"{label}: {k}")
    times: dict[str, list[float]] = {k: [] for k in [*sessions, *(others or {})]}
    for _ in range(args.rounds):
        for k, s in sessions.items():
            t0 = time.perf_counter()
            s.run_with_iobinding(bound[k])
            bound[k].synchronize_outputs()
            times[k].append(time.perf_counter() - t0)
        for k, fn in (others or {}).items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    print(f"  {label:<26}" + "  ".join(f"{k} {statistics.median(t) * 1e3:7.2f}" for k, t in times.items()), flush=True)


def bind(s: ort.InferenceSession, feeds: dict[str, np.ndarray], outputs: list[str], device: str) -> ort.IOBinding:
    """``s``'s inputs copied to ``device`` once, its outputs bound there (allocated by the first run)."""
    binding = s.io_binding()
    for name, value in feeds.items():
        binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(value, device, 0))
    for name in outputs:
        binding.bind_output(name, device, 0)
    return binding


def normal(*shape) -> np.ndarray:
    return RNG.standard_normal(shape, np.float32)


def windows(src: str, tag: str, k: int, out: int, stride: int = 1) -> tuple[list, list[str]]:
    """Nodes slicing, from the padded ``src`` [*, *, H, W], the window (``out`` x ``out``, every
    ``stride``-th pixel) each tap of a k x k kernel reads, row-major; and the slices' names.
    Reads the ints ``hw`` ([2, 3]) and, for a stride, ``st2`` defined by the caller."""
    nodes, names = [], []
    for i, j in itertools.product(range(k), range(k)):
        t = f"{tag}_{i}{j}"
        nodes += [ints("tb" + t, [i, j]), ints("te" + t, [i + (out - 1) * stride + 1, j + (out - 1) * stride + 1]),
                  h.make_node("Slice", [src, "tb" + t, "te" + t, "hw"] + (["st2"] if stride != 1 else []), ["t" + t])]
        names.append("t" + t)
    return nodes, names


# -- cases -----------------------------------------------------------------------------------------

def gathered_columns(src: str, tag: str, c: int, side: int, k: int, st: int, p: int,
                     flip: bool = False, zero_row: bool = True) -> tuple[list, str]:
    """Nodes building the columns of ``src`` [N, c, side, side] for a kxk Conv (pads p, stride
    st) as ``conv_gather.columns`` does: batch-innermost, [c, side * side, N], one zero row padded
    after its pixels (which the taps reading the padding gather), one Gather at constant flat
    positions, [c * k * k, O * N] (taps reversed with ``flip``); and the columns' name. With
    ``zero_row`` False, the padded grid [c, side + 2p, side + 2p, N] it replaced."""
    out, wp = (side + 2 * p - k) // st + 1, side + 2 * p
    taps = [(i, j) for i in range(k) for j in range(k)]
    if zero_row:
        inside = lambda r, q: 0 <= r < side and 0 <= q < side
        index = np.array([[(oi * st + i - p) * side + oj * st + j - p if inside(oi * st + i - p, oj * st + j - p)
                           else side * side for oi in range(out) for oj in range(out)] for i, j in taps], np.int32)
        layout = [h.make_node("Transpose", [src], [tag + "t"], perm=[1, 2, 3, 0]), ints(tag + "flat", [c, side * side, -1]),
                  h.make_node("Reshape", [tag + "t", tag + "flat"], [tag + "r"]), ints(tag + "pads", [0, 0, 0, 0, 1, 0]),
                  h.make_node("Pad", [tag + "r", tag + "pads"], [tag + "f"])]
    else:
        index = np.array([[(oi * st + i) * wp + oj * st + j for oi in range(out) for oj in range(out)]
                          for i, j in taps], np.int32)
        layout = [h.make_node("Transpose", [src], [tag + "t"], perm=[1, 2, 3, 0]),
                  ints(tag + "pads", [0, p, p, 0, 0, p, p, 0]), h.make_node("Pad", [tag + "t", tag + "pads"], [tag + "p"]),
                  ints(tag + "flat", [c, wp * wp, -1]), h.make_node("Reshape", [tag + "p", tag + "flat"], [tag + "f"])]
    index = index[::-1].copy() if flip else index
    return layout + [const(tag + "idx", index, np.int32), h.make_node("Gather", [tag + "f", tag + "idx"], [tag + "g"], axis=1),
                     ints(tag + "cs", [c * k * k, -1]), h.make_node("Reshape", [tag + "g", tag + "cs"], [tag + "cols"])
                     ], tag + "cols"


def gathered_dw(n: int, ci: int, co: int, side: int, k: int, st: int, group: int = 1, zero_row: bool = True) -> list:
    """A kxk Conv's dW (pad k//2) as ``_conv_weight_grad_gathered`` takes it: the gathered
    columns of x, one GEMM against dy (for ``group`` > 1 one MatMul batched over the groups)."""
    nodes, cols = gathered_columns("x", "x_", ci, side, k, st, k // 2, zero_row=zero_row)
    nodes += [h.make_node("Transpose", ["dy"], ["dyg"], perm=[1, 2, 3, 0]),
              ints("gdys", [co, -1]), h.make_node("Reshape", ["dyg", "gdys"], ["dyg2"])]
    if group == 1:
        return nodes + [h.make_node("Gemm", ["dyg2", cols], ["gg"], transB=1), ints("gws", [co, ci, k, k]),
                        h.make_node("Reshape", ["gg", "gws"], ["dw"])]
    return nodes + [ints("gd3", [group, co // group, -1]), h.make_node("Reshape", ["dyg2", "gd3"], ["dyg3"]),
                    ints("gc3", [group, ci // group * k * k, -1]), h.make_node("Reshape", [cols, "gc3"], ["gcols3"]),
                    h.make_node("Transpose", ["gcols3"], ["gcolst"], perm=[0, 2, 1]),
                    h.make_node("MatMul", ["dyg3", "gcolst"], ["gg"]), ints("gws", [co, ci // group, k, k]),
                    h.make_node("Reshape", ["gg", "gws"], ["dw"])]


def gathered_product(src: str, weight: str, out_name: str, ci: int, co: int, side: int, k: int, p: int,
                     flip: bool = False, group: int = 1, stride: int = 1) -> list:
    """A kxk Conv of ``src`` by ``weight`` [co, ci/group, k, k] (flipped in space with ``flip``)
    as ``conv_gather.gathered_conv`` takes a dense stride-1 one: the gathered columns times the
    weight, one Gemm (one MatMul batched over the groups for ``group`` > 1), back to [N, co, O, O]."""
    out = (side + 2 * p - k) // stride + 1
    nodes, cols = gathered_columns(src, "c_", ci, side, k, stride, p, flip)
    if group == 1:
        nodes += [ints("w2s", [co, -1]), h.make_node("Reshape", [weight, "w2s"], ["w2"]),
                  h.make_node("Gemm", ["w2", cols], ["y2"])]
    else:
        nodes += [ints("w3s", [group, co // group, -1]), h.make_node("Reshape", [weight, "w3s"], ["w3"]),
                  ints("c3s", [group, ci // group * k * k, -1]), h.make_node("Reshape", [cols, "c3s"], ["c3"]),
                  h.make_node("MatMul", ["w3", "c3"], ["y2"])]
    return nodes + [ints("y3s", [co, out * out, -1]),
                    h.make_node("Reshape", ["y2", "y3s"], ["y3"]), h.make_node("Transpose", ["y3"], ["y4"], perm=[2, 0, 1]),
                    ints("y5s", [-1, co, out, out]), h.make_node("Reshape", ["y4", "y5s"], [out_name])]


def bn(args) -> None:
    for shape in [(32, 96, 32, 32), (32, 144, 16, 16), (32, 672, 4, 4), (32, 64, 16, 16), (2, 256, 8, 8)]:
        n, c, hh, w = shape
        stats = [const("eps", 1e-5), const("count", float(n * hh * w)), ints("axes", [0, 2, 3]),
                 h.make_node("ReduceMean", ["x"], ["mean"], axes=[0, 2, 3]), h.make_node("Sub", ["x", "mean"], ["xc"]),
                 h.make_node("Mul", ["xc", "xc"], ["xc2"]), h.make_node("ReduceMean", ["xc2"], ["var"], axes=[0, 2, 3]),
                 h.make_node("Add", ["var", "eps"], ["ve"]), h.make_node("Sqrt", ["ve"], ["sd"]),
                 h.make_node("Reciprocal", ["sd"], ["inv"]), ints("cax", [1, 2]), h.make_node("Unsqueeze", ["scale", "cax"], ["sc"]),
                 h.make_node("Mul", ["sc", "inv"], ["k"]), h.make_node("ReduceSum", ["dy", "axes"], ["s1"])]
        textbook = stats + [
            h.make_node("Unsqueeze", ["bias", "cax"], ["bc"]), h.make_node("Mul", ["xc", "inv"], ["xhat"]),
            h.make_node("Mul", ["xhat", "sc"], ["y0"]), h.make_node("Add", ["y0", "bc"], ["y"]),
            h.make_node("Mul", ["dy", "xhat"], ["dyx"]), h.make_node("ReduceSum", ["dyx", "axes"], ["s2"]),
            h.make_node("Div", ["s1", "count"], ["s1n"]), h.make_node("Div", ["s2", "count"], ["s2n"]),
            h.make_node("Sub", ["dy", "s1n"], ["t1"]), h.make_node("Mul", ["xhat", "s2n"], ["t2"]),
            h.make_node("Sub", ["t1", "t2"], ["inner"]), h.make_node("Mul", ["inner", "k"], ["dx"])]
        affine = stats + [
            const("zeros", np.zeros(c)), h.make_node("Squeeze", ["var", "axes"], ["var_c"]),
            h.make_node("BatchNormalization", ["xc", "scale", "bias", "zeros", "var_c"], ["y"], epsilon=1e-5),
            h.make_node("Mul", ["dy", "xc"], ["dyxc"]), h.make_node("ReduceSum", ["dyxc", "axes"], ["s2c"]),
            h.make_node("Mul", ["s2c", "inv"], ["s2"]), h.make_node("Div", ["s2", "count"], ["s2n"]),
            h.make_node("Div", ["s1", "count"], ["s1n"]), h.make_node("Mul", ["k", "s2n"], ["a0"]),
            h.make_node("Neg", ["a0"], ["a1"]), h.make_node("Squeeze", ["a1", "axes"], ["slope"]),
            h.make_node("Mul", ["k", "s1n"], ["b0"]), h.make_node("Neg", ["b0"], ["b1"]),
            h.make_node("Squeeze", ["b1", "axes"], ["shift"]),
            h.make_node("BatchNormalization", ["xc", "slope", "shift", "zeros", "var_c"], ["rest"], epsilon=1e-5),
            h.make_node("Mul", ["dy", "k"], ["kdy"]), h.make_node("Add", ["kdy", "rest"], ["dx"])]
        feeds = {"x": 2 * normal(*shape) + 0.5, "dy": normal(*shape), "scale": normal(c), "bias": normal(c)}
        compare(str(shape), {"affine-bn": affine, "textbook": textbook}, feeds, ["y", "dx"], args)


def bn_stats(args) -> None:
    for shape in [(32, 64, 64, 64), (32, 96, 32, 32), (32, 256, 16, 16), (32, 672, 4, 4), (2, 256, 8, 8)]:
        n, c, hh, w = shape
        out = [ints("cshape", [1, c, 1, 1])]
        whole = out + [ints("axes", [0, 2, 3]), h.make_node("ReduceSum", ["x", "axes"], ["s"])]
        rows = out + [ints("nchw", [n, c, hh * w]), h.make_node("Reshape", ["x", "nchw"], ["x3"]),
                      ints("a2", [2]), h.make_node("ReduceSum", ["x3", "a2"], ["r"], keepdims=0),
                      ints("a0", [0]), h.make_node("ReduceSum", ["r", "a0"], ["r0"], keepdims=0),
                      h.make_node("Reshape", ["r0", "cshape"], ["s"])]
        gemv = out + [ints("rows", [n * c, hh * w]), h.make_node("Reshape", ["x", "rows"], ["x2"]),
                      const("ones", np.ones((hh * w, 1))), h.make_node("MatMul", ["x2", "ones"], ["m"]),
                      ints("nc", [n, c]), h.make_node("Reshape", ["m", "nc"], ["m2"]),
                      ints("a0", [0]), h.make_node("ReduceSum", ["m2", "a0"], ["r0"], keepdims=0),
                      h.make_node("Reshape", ["r0", "cshape"], ["s"])]
        compare(str(shape), {"reduce-0,2,3": whole, "axis2-then-0": rows, "gemv": gemv}, {"x": normal(*shape)},
                ["s"], args)


def bn_sums(args) -> None:
    """BatchNorm's per-channel sums over (N, H, W) of a product and of a square (its backward's
    sum(dy * (x - mean)), its variance): Mul then ReduceSum vs a MatMul batched over (N, C) of
    [1, H*W] rows by [H*W, 1] columns (then over N) vs Einsum; the square's sum vs
    ReduceSumSquare vs GlobalLpPool(p=2) squared (then over N)."""
    for n, c, hh in [(32, 32, 64), (32, 96, 64), (32, 144, 32), (32, 240, 16), (32, 672, 8), (2, 96, 32)]:
        hw, a0 = hh * hh, ints("a0", [0])
        product = {"mul+reduce": [h.make_node("Mul", ["a", "b"], ["p"]), ints("ax", [0, 2, 3]),
                                  h.make_node("ReduceSum", ["p", "ax"], ["s"], keepdims=0)],
                   "batched-dot": [ints("r1", [n, c, 1, hw]), ints("r2", [n, c, hw, 1]), ints("cs", [n, c]),
                                   h.make_node("Reshape", ["a", "r1"], ["a1"]), h.make_node("Reshape", ["b", "r2"], ["b1"]),
                                   h.make_node("MatMul", ["a1", "b1"], ["d"]), h.make_node("Reshape", ["d", "cs"], ["d2"]),
                                   a0, h.make_node("ReduceSum", ["d2", "a0"], ["s"], keepdims=0)],
                   "einsum": [ints("r3", [n, c, hw]), h.make_node("Reshape", ["a", "r3"], ["a3"]),
                              h.make_node("Reshape", ["b", "r3"], ["b3"]),
                              h.make_node("Einsum", ["a3", "b3"], ["s"], equation="nck,nck->c")]}
        compare(f"prod N={n} {c}ch {hh}x{hh}", product, {"a": normal(n, c, hh, hh), "b": normal(n, c, hh, hh)}, ["s"], args)
        square = {"mul+reduce": [h.make_node("Mul", ["a", "a"], ["p"]), ints("ax", [0, 2, 3]),
                                 h.make_node("ReduceSum", ["p", "ax"], ["s"], keepdims=0)],
                  "sum-square": [h.make_node("ReduceSumSquare", ["a"], ["s"], axes=[0, 2, 3], keepdims=0)],
                  "lp-pool": [h.make_node("GlobalLpPool", ["a"], ["g"], p=2), h.make_node("Mul", ["g", "g"], ["g2"]),
                              ints("cs", [n, c]), h.make_node("Reshape", ["g2", "cs"], ["g3"]), a0,
                              h.make_node("ReduceSum", ["g3", "a0"], ["s"], keepdims=0)]}
        compare(f"sq   N={n} {c}ch {hh}x{hh}", square, {"a": normal(n, c, hh, hh)}, ["s"], args)


def split_sum(src: str, out: str, tag: str) -> list:
    """``src`` [N, C, H, W] summed per channel as ``rules_norm.channel_reduce`` writes it on the CPU:
    over (H, W), then over N, into ``out`` [C]."""
    return [ints(f"hw{tag}", [2, 3]), h.make_node("ReduceSum", [src, f"hw{tag}"], [f"r{tag}"], keepdims=0),
            ints(f"n{tag}", [0]), h.make_node("ReduceSum", [f"r{tag}", f"n{tag}"], [out], keepdims=0)]


def bn_passes(args) -> None:
    """Training BatchNorm's passes over the activations, each part as the rule writes it vs one
    pass fewer: the backward's sums s1 = sum(dy), s2 = sum(dy * c) (c the centred input) as two
    reductions vs one over Concat([dy, dy * c]); its dx = dy * k + Conv(c) (the Add fused) vs
    dy + Conv(c) (k pushed into the next Conv's weights, not timed); the forward's mean and
    variance as two passes (mean, Sub, Mul, mean) and the normalisation of c vs E[x] and E[x^2]
    in one pass and the normalisation of x by its mean. Inputs N(0, 1) (E[x^2] - E[x]^2 loses
    the variance of a large mean in float32: not timed here)."""
    for n, c, side in [(32, 64, 16), (32, 128, 8), (32, 256, 16), (32, 96, 32), (2, 64, 16), (2, 256, 8)]:
        full = (n, c, side, side)
        sums = {"two": [h.make_node("Mul", ["dy", "c"], ["p"])] + split_sum("dy", "s1", "1") + split_sum("p", "s2", "2")
                + [h.make_node("Concat", ["s1", "s2"], ["s"], axis=0)],
                "concat": [h.make_node("Mul", ["dy", "c"], ["p"]), h.make_node("Concat", ["dy", "p"], ["q"], axis=1)]
                + split_sum("q", "s", "")}
        compare(f"sums N={n} {c}ch {side}x{side}", sums, {"dy": normal(*full), "c": normal(*full)}, ["s"], args)
        conv = [ints("ws", [c, 1, 1, 1]), h.make_node("Reshape", ["a", "ws"], ["w"]),
                h.make_node("Conv", ["c", "w", "b"], ["z"], group=c)]
        dx = {"dy*k+conv": conv + [ints("cs", [c, 1, 1]), h.make_node("Reshape", ["k", "cs"], ["kc"]),
                                   h.make_node("Mul", ["dy", "kc"], ["q"]), h.make_node("Add", ["q", "z"], ["dx"])],
              "dy+conv": conv + [h.make_node("Add", ["dy", "z"], ["dx"])]}
        compare("  dx", dx, {"dy": normal(*full), "c": normal(*full), "a": normal(c), "b": normal(c),
                             "k": np.ones(c, np.float32)}, ["dx"], args)
        zeros = const("zeros", np.zeros(c))
        stats = {"two-pass": split_sum("x", "sx", "1") + [
                     const("count", n * side * side), h.make_node("Div", ["sx", "count"], ["m"]),
                     ints("cs", [c, 1, 1]), h.make_node("Reshape", ["m", "cs"], ["mc"]),
                     h.make_node("Sub", ["x", "mc"], ["xc"]), h.make_node("Mul", ["xc", "xc"], ["sq"])]
                     + split_sum("sq", "ss", "2") + [
                     h.make_node("Div", ["ss", "count"], ["v"]), zeros,
                     h.make_node("BatchNormalization", ["xc", "a", "b", "zeros", "v"], ["y"])],
                 "one-pass": [h.make_node("Mul", ["x", "x"], ["sq"])] + split_sum("x", "sx", "1")
                 + split_sum("sq", "ss", "2") + [
                     const("count", n * side * side), h.make_node("Div", ["sx", "count"], ["m"]),
                     h.make_node("Div", ["ss", "count"], ["m2"]), h.make_node("Mul", ["m", "m"], ["mm"]),
                     h.make_node("Sub", ["m2", "mm"], ["v"]),
                     h.make_node("BatchNormalization", ["x", "a", "b", "m", "v"], ["y"])]}
        compare("  mean, var, normalise", stats, {"x": normal(*full), "a": normal(c), "b": normal(c)}, ["y"], args)


def silu(args) -> None:
    forward = [h.make_node("Sigmoid", ["x"], ["s"]), h.make_node("Mul", ["x", "s"], ["y"]), const("one", 1.0)]
    whole = forward + [h.make_node("Sub", ["one", "s"], ["oms"]), h.make_node("Mul", ["y", "oms"], ["t"]),
                       h.make_node("Add", ["s", "t"], ["slope"]), h.make_node("Mul", ["dy", "slope"], ["dx"])]
    by_node = forward + [h.make_node("Mul", ["dy", "s"], ["dx1"]), h.make_node("Mul", ["dy", "x"], ["ds"]),
                         h.make_node("Sub", ["one", "s"], ["oms"]), h.make_node("Mul", ["s", "oms"], ["t"]),
                         h.make_node("Mul", ["ds", "t"], ["dx2"]), h.make_node("Add", ["dx1", "dx2"], ["dx"])]
    for shape in [(32, 96, 32, 32), (32, 144, 16, 16), (32, 672, 4, 4), (2, 96, 32, 32)]:
        compare(str(shape), {"whole": whole, "by-node": by_node}, {"x": 3 * normal(*shape), "dy": normal(*shape)},
                ["y", "dx"], args)


def gelu(args) -> None:
    import math

    forward = [const("r2", math.sqrt(2)), const("one", 1.0), const("half", 0.5), h.make_node("Div", ["x", "r2"], ["u"]),
               h.make_node("Erf", ["u"], ["e"]), h.make_node("Add", ["e", "one"], ["a"]),
               h.make_node("Mul", ["x", "a"], ["m"]), h.make_node("Mul", ["m", "half"], ["y"]),
               h.make_node("Mul", ["dy", "half"], ["dm"]), const("mhalf", -0.5), const("c", math.sqrt(2 / math.pi))]
    bump = [h.make_node("Mul", ["x", "mhalf"], ["x0"]), h.make_node("Mul", ["x0", "x"], ["x1"]),
            h.make_node("Exp", ["x1"], ["b"]), h.make_node("Mul", ["x", "c"], ["xc"]), h.make_node("Mul", ["xc", "b"], ["t"])]
    whole = forward + bump + [h.make_node("Add", ["a", "t"], ["slope"]), h.make_node("Mul", ["dm", "slope"], ["dx"])]
    recompute = forward + bump + [const("ir2", 1 / math.sqrt(2)), h.make_node("Mul", ["x", "ir2"], ["u2"]),
                                  h.make_node("Erf", ["u2"], ["e2"]), h.make_node("Add", ["e2", "t"], ["et"]),
                                  h.make_node("Add", ["et", "one"], ["slope"]), h.make_node("Mul", ["dm", "slope"], ["dx"])]
    by_node = forward + [const("k", 2 / math.sqrt(math.pi)),
                         h.make_node("Mul", ["dm", "a"], ["dx1"]), h.make_node("Mul", ["dm", "x"], ["de"]),
                         h.make_node("Mul", ["u", "u"], ["u2"]), h.make_node("Neg", ["u2"], ["nu2"]),
                         h.make_node("Exp", ["nu2"], ["ex"]), h.make_node("Mul", ["ex", "k"], ["ek"]),
                         h.make_node("Mul", ["de", "ek"], ["du"]), h.make_node("Div", ["du", "r2"], ["dx2"]),
                         h.make_node("Add", ["dx1", "dx2"], ["dx"])]
    # from x alone, exp(-x^2/2) as 1 / exp(u^2): dx = dm * (1 + erf(u) + 2/sqrt(pi) * u / exp(u^2)),
    # or from the GELU's own output gradient dy (no ``dm = dy * 0.5``): dy * (Phi + u / (sqrt(pi)
    # exp(u^2))), Phi = HardSigmoid(erf(u), 0.5, 0.5) (in [0, 1], so never clipped)
    quotient = [const("ir2", 1 / math.sqrt(2)), h.make_node("Mul", ["x", "ir2"], ["u2"]),
                h.make_node("Erf", ["u2"], ["e2"]), h.make_node("Mul", ["u2", "u2"], ["s2"]),
                h.make_node("Exp", ["s2"], ["x2"]), h.make_node("Div", ["u2", "x2"], ["q"])]
    div_exp = forward + quotient + [const("k", 2 / math.sqrt(math.pi)), h.make_node("Mul", ["q", "k"], ["qk"]),
                                    h.make_node("Add", ["e2", "qk"], ["eq"]), h.make_node("Add", ["eq", "one"], ["slope"]),
                                    h.make_node("Mul", ["dm", "slope"], ["dx"])]
    hard_sigmoid = [n for n in forward if n.output != ["dm"]] + quotient + [
        const("k", 1 / math.sqrt(math.pi)), h.make_node("Mul", ["q", "k"], ["qk"]),
        h.make_node("HardSigmoid", ["e2"], ["cdf"], alpha=0.5, beta=0.5), h.make_node("Add", ["cdf", "qk"], ["slope"]),
        h.make_node("Mul", ["dy", "slope"], ["dx"])]
    for shape in [(4096, 1024), (2080, 768), (130, 768)]:
        compare(str(shape), {"whole": whole, "recompute-erf": recompute, "by-node": by_node, "div-exp": div_exp,
                             "hardsigmoid": hard_sigmoid},
                {"x": 2 * normal(*shape), "dy": normal(*shape)}, ["y", "dx"], args)


def layer_norm(args) -> None:
    """LayerNormalization over the last axis, forward + backward from its Mean and InvStdDev
    outputs: the textbook dx (d = dy * scale; d - mean(d) - xhat * mean(d * xhat), times invstd)
    vs dx = (dy * invstd) * scale + (xc * k1 + k0), the per-row affine part by Mul and Add or by
    an inference-mode BatchNormalization over [1, rows, D] (eps 0, var 1), its two row means from
    dy * xhat (dscale's product) and dy by GEMVs against the scale or by Mul + ReduceMean."""
    head = [h.make_node("LayerNormalization", ["x", "scale", "bias"], ["y", "mu", "inv"], axis=-1, epsilon=1e-5),
            h.make_node("Sub", ["x", "mu"], ["xc"]), ints("rows", [0, 1]),
            h.make_node("ReduceSum", ["dy", "rows"], ["dbias"], keepdims=0)]
    textbook = head + [
        h.make_node("Mul", ["xc", "inv"], ["xhat"]), h.make_node("Mul", ["dy", "xhat"], ["p"]),
        h.make_node("ReduceSum", ["p", "rows"], ["dscale"], keepdims=0), h.make_node("Mul", ["dy", "scale"], ["d"]),
        h.make_node("ReduceMean", ["d"], ["md"], axes=[-1]), h.make_node("Mul", ["d", "xhat"], ["dxh"]),
        h.make_node("ReduceMean", ["dxh"], ["mdx"], axes=[-1]), h.make_node("Sub", ["d", "md"], ["t1"]),
        h.make_node("Mul", ["xhat", "mdx"], ["t2"]), h.make_node("Sub", ["t1", "t2"], ["t3"]),
        h.make_node("Mul", ["t3", "inv"], ["dx"])]

    def folded(means: list, affine: list) -> list:
        # k1 = -invstd^2 * mean(d * xhat), k0 = -invstd * mean(d)
        return head + [
            h.make_node("Mul", ["dy", "inv"], ["q"]), h.make_node("Mul", ["q", "xc"], ["p"]),
            h.make_node("ReduceSum", ["p", "rows"], ["dscale"], keepdims=0), *means,
            h.make_node("Mul", ["inv", "inv"], ["inv2"]), h.make_node("Mul", ["inv2", "mdx"], ["nk1"]),
            h.make_node("Neg", ["nk1"], ["k1"]), h.make_node("Mul", ["inv", "md"], ["nk0"]),
            h.make_node("Neg", ["nk0"], ["k0"]), h.make_node("Mul", ["q", "scale"], ["a"]), *affine,
            h.make_node("Add", ["a", "b"], ["dx"])]

    for shape in [(32, 128, 256), (32, 65, 192), (2, 128, 256)]:
        d, r = shape[-1], shape[0] * shape[1]
        gemv = [ints("col", [d, 1]), h.make_node("Reshape", ["scale", "col"], ["sc"]),
                const("invd", 1.0 / d), h.make_node("MatMul", ["p", "sc"], ["sp"]), h.make_node("Mul", ["sp", "invd"], ["mdx"]),
                h.make_node("MatMul", ["dy", "sc"], ["sd"]), h.make_node("Mul", ["sd", "invd"], ["md"])]
        reduce = [h.make_node("Mul", ["p", "scale"], ["ps"]), h.make_node("ReduceMean", ["ps"], ["mdx"], axes=[-1]),
                  h.make_node("Mul", ["dy", "scale"], ["ds"]), h.make_node("ReduceMean", ["ds"], ["md"], axes=[-1])]
        mul_add = [h.make_node("Mul", ["xc", "k1"], ["b1"]), h.make_node("Add", ["b1", "k0"], ["b"])]
        bn = [ints("rd", [1, r, d]), ints("r1", [r]), ints("back", list(shape)), const("zero", np.zeros(r)),
              const("unit", np.ones(r)), h.make_node("Reshape", ["xc", "rd"], ["xc3"]),
              h.make_node("Reshape", ["k1", "r1"], ["k1r"]), h.make_node("Reshape", ["k0", "r1"], ["k0r"]),
              h.make_node("BatchNormalization", ["xc3", "k1r", "k0r", "zero", "unit"], ["b3"], epsilon=0.0),
              h.make_node("Reshape", ["b3", "back"], ["b"])]
        feeds = {"x": 2 * normal(*shape) + 0.5, "dy": normal(*shape), "scale": normal(d), "bias": normal(d)}
        compare(str(shape), {"textbook": textbook, "gemv-mul-add": folded(gemv, mul_add), "gemv-bn": folded(gemv, bn),
                             "reduce-bn": folded(reduce, bn)}, feeds, ["y", "dx", "dscale", "dbias"], args)


def leading_sum(args) -> None:
    """A bias's gradient, dy summed over its leading axes: ReduceSum vs a GEMV, ones [R] x dy as [R, F]."""
    for shape in [(32, 128, 1024), (32, 128, 256), (32, 65, 192), (2, 128, 256), (4096, 8)]:
        rows, width = int(np.prod(shape[:-1])), shape[-1]
        reduce = [ints("axes", list(range(len(shape) - 1))), h.make_node("ReduceSum", ["dy", "axes"], ["db"], keepdims=0)]
        gemv = [ints("rf", [-1, width]), h.make_node("Reshape", ["dy", "rf"], ["d2"]), const("ones", np.ones(rows)),
                h.make_node("MatMul", ["ones", "d2"], ["db"])]
        compare(str(shape), {"reducesum": reduce, "gemv": gemv}, {"dy": normal(*shape)}, ["db"], args)


def hardswish(args) -> None:
    forward = [h.make_node("HardSwish", ["x"], ["y"]), const("three", 3.0), const("m3", -3.0), const("half", 0.5),
               const("third", 1 / 3), const("zero", 0.0), const("one", 1.0)]
    where_mid = forward + [h.make_node("Div", ["x", "three"], ["x3"]), h.make_node("Add", ["x3", "half"], ["s"]),
                           h.make_node("Mul", ["dy", "s"], ["mid"]), h.make_node("LessOrEqual", ["x", "three"], ["le"]),
                           h.make_node("Where", ["le", "mid", "dy"], ["up"]), h.make_node("Less", ["x", "m3"], ["lo"]),
                           h.make_node("Where", ["lo", "zero", "up"], ["dx"])]
    where_slope = forward + [h.make_node("Mul", ["x", "third"], ["x3"]), h.make_node("Add", ["x3", "half"], ["s"]),
                             h.make_node("Greater", ["x", "three"], ["gt"]), h.make_node("Where", ["gt", "one", "s"], ["s1"]),
                             h.make_node("Less", ["x", "m3"], ["lo"]), h.make_node("Where", ["lo", "zero", "s1"], ["s2"]),
                             h.make_node("Mul", ["dy", "s2"], ["dx"])]
    # slope = Clip(x/3 + 0.5, -0.5, 1.5) where |x| <= 3, 1 above, 0 below: HardSigmoid(x) + x/6 * inside
    clip_form = forward + [h.make_node("HardSigmoid", ["x"], ["hs"], alpha=1 / 6, beta=0.5),
                           h.make_node("Abs", ["x"], ["ax"]), h.make_node("LessOrEqual", ["ax", "three"], ["inside"]),
                           h.make_node("Cast", ["inside"], ["inf"], to=1), h.make_node("Mul", ["x", "inf"], ["xi"]),
                           const("sixth", 1 / 6), h.make_node("Mul", ["xi", "sixth"], ["t"]),
                           h.make_node("Add", ["hs", "t"], ["s"]), h.make_node("Mul", ["dy", "s"], ["dx"])]
    # x * inside as x - Shrink(x, lambd=3) (Shrink: 0 inside [-3, 3], x outside)
    shrink_form = forward + [h.make_node("HardSigmoid", ["x"], ["hs"], alpha=1 / 6, beta=0.5),
                             h.make_node("Shrink", ["x"], ["out"], lambd=3.0), h.make_node("Sub", ["x", "out"], ["xi"]),
                             const("sixth", 1 / 6), h.make_node("Mul", ["xi", "sixth"], ["t"]),
                             h.make_node("Add", ["hs", "t"], ["s"]), h.make_node("Mul", ["dy", "s"], ["dx"])]
    for shape in [(32, 96, 16, 16), (32, 576, 2, 2), (2, 96, 16, 16)]:
        x = 4 * normal(*shape)
        compare(str(shape), {"where-dy": where_mid, "where-slope": where_slope, "hardsigmoid": clip_form,
                             "shrink": shrink_form},
                {"x": x, "dy": normal(*shape)}, ["y", "dx"], args)


def relu(args) -> None:
    forward = [h.make_node("Relu", ["x"], ["y"]), const("zero", 0.0)]
    variants = {"cast-mul": forward + [h.make_node("Greater", ["y", "zero"], ["m"]), h.make_node("Cast", ["m"], ["f"], to=1),
                                       h.make_node("Mul", ["dy", "f"], ["dx"])],
                "where": forward + [h.make_node("Greater", ["y", "zero"], ["m"]), h.make_node("Where", ["m", "dy", "zero"], ["dx"])],
                "sign-mul": forward + [h.make_node("Sign", ["y"], ["m"]), h.make_node("Mul", ["dy", "m"], ["dx"])],
                "hardsigmoid-mul": forward + [h.make_node("HardSigmoid", ["y"], ["m"], alpha=float(np.finfo(np.float32).max),
                                                          beta=0.0), h.make_node("Mul", ["dy", "m"], ["dx"])]}
    for shape in [(32, 256, 16, 16), (32, 64, 32, 32), (32, 512, 4, 4), (2, 64, 32, 32)]:
        compare(str(shape), variants, {"x": normal(*shape), "dy": normal(*shape)}, ["y", "dx"], args)


def bn_affine(args) -> None:
    # a training BatchNorm's per-channel affine of its centred input c (``rules_norm.normalize``),
    # inference BatchNormalization vs a 1x1 Conv of one channel a group, as the forward's
    # normalisation alone, before a Relu, before a residual Add (and a Relu), and as the
    # backward's xhat term added to dy * k (onnxruntime fuses the Relu and the Adds into the Conv)
    for n, c, side in [(32, 64, 32), (32, 96, 32), (32, 32, 64), (32, 128, 16), (32, 144, 16), (32, 256, 8),
                       (32, 440, 4), (2, 96, 32), (2, 256, 8)]:
        affine = {"bn": [const("zeros", np.zeros(c)), const("var", np.ones(c)),
                         h.make_node("BatchNormalization", ["c", "a", "b", "zeros", "var"], ["z"])],
                  "conv": [const("eps", 1e-5), const("one", 1.0), h.make_node("Add", ["one", "eps"], ["ve"]),
                           h.make_node("Sqrt", ["ve"], ["sd"]), h.make_node("Div", ["a", "sd"], ["wa"]),
                           ints("ws", [c, 1, 1, 1]), h.make_node("Reshape", ["wa", "ws"], ["w"]),
                           h.make_node("Conv", ["c", "w", "b"], ["z"], group=c)]}
        feeds = {"c": normal(n, c, side, side), "a": normal(c), "b": normal(c)}
        relu = [h.make_node("Relu", ["z"], ["y"])]
        added = [h.make_node("Add", ["z", "r"], ["y"])]
        rectified = [h.make_node("Add", ["z", "r"], ["s"]), h.make_node("Relu", ["s"], ["y"])]
        dy = [ints("cs", [c, 1, 1]), h.make_node("Reshape", ["a", "cs"], ["k"]), h.make_node("Mul", ["r", "k"], ["q"]),
              h.make_node("Add", ["q", "z"], ["y"])]
        compare(f"N={n} {c}ch {side}x{side}", {k: v + [h.make_node("Identity", ["z"], ["y"])] for k, v in affine.items()},
                feeds, ["y"], args)
        compare("  + Relu", {k: v + relu for k, v in affine.items()}, feeds, ["y"], args)
        compare("  + Add", {k: v + added for k, v in affine.items()}, {**feeds, "r": normal(n, c, side, side)}, ["y"], args)
        compare("  + Add, Relu", {k: v + rectified for k, v in affine.items()}, {**feeds, "r": normal(n, c, side, side)},
                ["y"], args)
        compare("  + dy * k", {k: v + dy for k, v in affine.items()}, {**feeds, "r": normal(n, c, side, side)}, ["y"], args)


def max_pool(args) -> None:
    # ResNet's stem pool, 3x3 stride 2 pads 1: the rule's Indices output and ScatterElements
    # against a forward MaxPool without Indices (onnxruntime's fast kernel) whose backward finds
    # each window's first maximum itself: per tap, the strided window values (``windows``) equal
    # to the window's max take what is left of dy (Where, then Sub), and the nine parts, shifted
    # by Pads, summed per row and column parity and interleaved (Concat, Reshape), are cropped
    # back to x's size. Padding is NaN: equal to nothing.
    pool = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    for n, c, side in [(32, 64, 32), (32, 64, 64), (2, 64, 32)]:
        out, half = side // 2, side // 2 + 1
        indices = [h.make_node("MaxPool", ["x"], ["y", "i"], **pool), ints("flat", [n * c * side * side]),
                   h.make_node("ConstantOfShape", ["flat"], ["z"], value=onnx.numpy_helper.from_array(np.zeros(1, np.float32))),
                   ints("m1", [-1]), h.make_node("Reshape", ["i", "m1"], ["fi"]), h.make_node("Reshape", ["dy", "m1"], ["fd"]),
                   h.make_node("ScatterElements", ["z", "fi", "fd"], ["s"], axis=0, reduction="add"),
                   h.make_node("Shape", ["x"], ["xs"]), h.make_node("Reshape", ["s", "xs"], ["dx"])]
        taps, names = windows("xp", "x", 3, out, stride=2)
        offsets = [h.make_node("MaxPool", ["x"], ["y"], **pool), ints("pp", [0, 0, 1, 1, 0, 0, 1, 1]),
                   const("nan", np.nan), const("zero", 0.0), h.make_node("Pad", ["x", "pp", "nan"], ["xp"]),
                   ints("hw", [2, 3]), ints("st2", [2, 2])] + taps
        left, parts = "dy", {}
        for k, (name, (a, b)) in enumerate(zip(names, itertools.product(range(3), range(3)))):
            offsets += [h.make_node("Equal", [name, "y"], [f"e{k}"]), h.make_node("Where", [f"e{k}", left, "zero"], [f"c{k}"])]
            if k < 8:
                offsets.append(h.make_node("Sub", [left, f"c{k}"], [f"left{k}"]))
                left = f"left{k}"
            offsets += [ints(f"sh{k}", [0, 0, a // 2, b // 2, 0, 0, 1 - a // 2, 1 - b // 2]),
                        h.make_node("Pad", [f"c{k}", f"sh{k}"], [f"p{k}"])]
            parts.setdefault((a % 2, b % 2), []).append(f"p{k}")
        offsets += [h.make_node("Sum", parts[key], [f"plane{key[0]}{key[1]}"]) for key in parts]
        offsets += [ints("last", [-1]), ints("row", [n, c, half, 1, 2 * half]), ints("full", [n, c, 2 * half, 2 * half]),
                    ints("crop0", [1, 1]), ints("crop1", [side + 1, side + 1])]
        for pa in range(2):
            offsets += [h.make_node("Unsqueeze", [f"plane{pa}{pb}", "last"], [f"u{pa}{pb}"]) for pb in range(2)]
            offsets += [h.make_node("Concat", [f"u{pa}0", f"u{pa}1"], [f"r{pa}"], axis=-1),
                        h.make_node("Reshape", [f"r{pa}", "row"], [f"rows{pa}"])]
        offsets += [h.make_node("Concat", ["rows0", "rows1"], ["grid"], axis=3), h.make_node("Reshape", ["grid", "full"], ["whole"]),
                    h.make_node("Slice", ["whole", "crop0", "crop1", "hw"], ["dx"])]
        x = np.maximum(normal(n, c, side, side), 0)  # after a ReLU: windows of zeros, ties
        compare(f"N={n} {c}ch {side}x{side}", {"indices": indices, "offsets": offsets},
                {"x": x, "dy": normal(n, c, out, out)}, ["y", "dx"], args)


def pointwise_dx(args) -> None:
    for n, ci, co, side in [(32, 512, 2048, 2), (32, 96, 576, 2), (2, 512, 2048, 2), (2, 256, 1024, 4),
                            (32, 256, 1024, 4), (2, 128, 512, 8), (32, 64, 256, 16)]:
        p = side * side
        gemm = [ints("s2", [co, ci]), h.make_node("Reshape", ["w", "s2"], ["w2"]), ints("s3", [n, co, p]),
                h.make_node("Reshape", ["dy", "s3"], ["d3"]), h.make_node("Transpose", ["d3"], ["dt"], perm=[1, 0, 2]),
                ints("s4", [co, n * p]), h.make_node("Reshape", ["dt", "s4"], ["d2"]),
                h.make_node("Gemm", ["w2", "d2"], ["o2"], transA=1), ints("s5", [ci, n, side, side]),
                h.make_node("Reshape", ["o2", "s5"], ["o4"]), h.make_node("Transpose", ["o4"], ["dx"], perm=[1, 0, 2, 3])]
        conv = [h.make_node("Transpose", ["w"], ["wt"], perm=[1, 0, 2, 3]), h.make_node("Conv", ["dy", "wt"], ["dx"])]
        transposed = [h.make_node("ConvTranspose", ["dy", "w"], ["dx"])]
        compare(f"N={n} {ci}<-{co} {side}x{side}", {"gemm": gemm, "conv": conv, "convT": transposed},
                {"dy": normal(n, co, side, side), "w": normal(co, ci, 1, 1)}, ["dx"], args)


def pointwise_dw(args) -> None:
    """A 1x1 Conv's dW [Co, Ci] from dy [N, Co, H, W] and x [N, Ci, H, W]: one Einsum vs a batched
    MatMul per image (x read transposed: onnxruntime fuses the Transpose into a FusedMatMul) summed
    over the batch vs channel-major Transposes and one Gemm."""
    for n, ci, co, side in [(2, 256, 64, 16), (32, 1024, 2048, 2), (2, 1024, 2048, 2), (32, 112, 672, 8), (32, 320, 1280, 4), (32, 1152, 192, 4), (32, 480, 80, 8), (32, 512, 128, 8), (32, 1024, 256, 4), (2, 512, 128, 8), (2, 64, 256, 16), (32, 16, 96, 64), (32, 96, 24, 32), (32, 24, 144, 32), (32, 144, 24, 32),
                            (32, 40, 240, 16), (32, 240, 40, 16), (32, 672, 112, 8), (2, 96, 24, 32), (32, 256, 64, 16)]:
        einsum = [h.make_node("Einsum", ["dy", "x"], ["dw"], equation="nmhw,nchw->mc")]
        batched = [ints("s3x", [n, ci, side * side]), ints("s3y", [n, co, side * side]), ints("n0", [0]),
                   h.make_node("Reshape", ["x", "s3x"], ["x3"]), h.make_node("Reshape", ["dy", "s3y"], ["y3"]),
                   h.make_node("Transpose", ["x3"], ["x3t"], perm=[0, 2, 1]),
                   h.make_node("MatMul", ["y3", "x3t"], ["per"]),
                   h.make_node("ReduceSum", ["per", "n0"], ["dw"], keepdims=0)]
        gemm = [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2, 3]), ints("sx", [ci, -1]),
                h.make_node("Reshape", ["xt", "sx"], ["x2"]),
                h.make_node("Transpose", ["dy"], ["yt"], perm=[1, 0, 2, 3]), ints("sy", [co, -1]),
                h.make_node("Reshape", ["yt", "sy"], ["y2"]), h.make_node("Gemm", ["y2", "x2"], ["dw"], transB=1)]
        compare(f"N={n} {ci}->{co} {side}x{side}", {"einsum": einsum, "batched": batched, "gemm": gemm},
                {"x": normal(n, ci, side, side), "dy": normal(n, co, side, side)}, ["dw"], args)


def strided_pointwise_dx(args) -> None:
    for n, ci, co, side in [(32, 1024, 2048, 4), (32, 512, 1024, 4), (32, 1024, 2048, 8), (32, 256, 512, 8),
                            (32, 256, 512, 16), (2, 256, 512, 16)]:
        half = side // 2
        spread = [h.make_node("Transpose", ["w"], ["wt"], perm=[1, 0, 2, 3]), h.make_node("Conv", ["dy", "wt"], ["t"]),
                  ints("s6", [n, ci, half, 1, half, 1]), h.make_node("Reshape", ["t", "s6"], ["t6"]),
                  ints("pads", [0] * 6 + [0, 0, 0, 1, 0, 1]), h.make_node("Pad", ["t6", "pads"], ["p6"]),
                  ints("s4", [n, ci, side, side]), h.make_node("Reshape", ["p6", "s4"], ["dx"])]
        transposed = [h.make_node("ConvTranspose", ["dy", "w"], ["dx"], strides=[2, 2], output_shape=[side, side])]
        compare(f"N={n} {ci}<-{co} {side}x{side}", {"conv+pad": spread, "convT": transposed},
                {"dy": normal(n, co, half, half), "w": normal(co, ci, 1, 1)}, ["dx"], args)


def per_image_dw(n: int, c: int, side: int, out: int, k: int, pads: list[int], stride: int = 1) -> list:
    """A depthwise kxk Conv's dW as ``_depthwise_weight_grad_per_image`` takes it: one Conv whose
    n*c groups are each image's channels, x [1, n*c, side, side] by dy as its kernels (dilated by
    the stride), cut to the kernel where its ``pads`` reach past it, then the images' sum."""
    reach = side + pads[0] + pads[2] - stride * (out - 1)
    nodes = [ints("s5", [1, n * c, side, side]), h.make_node("Reshape", ["x", "s5"], ["xi"]),
             ints("s6", [n * c, 1, out, out]), h.make_node("Reshape", ["dy", "s6"], ["dyi"]),
             h.make_node("Conv", ["xi", "dyi"], ["dwi"], pads=pads, dilations=[stride, stride], group=n * c)]
    if reach != k:
        nodes += [ints("z", [0, 0]), ints("kk", [k, k]), ints("hw", [2, 3]),
                  h.make_node("Slice", ["dwi", "z", "kk", "hw"], ["dwc"])]
    return nodes + [ints("s7", [n, c * k * k]), h.make_node("Reshape", ["dwc" if reach != k else "dwi", "s7"], ["dwn"]),
                    ints("ax0", [0]), h.make_node("ReduceSum", ["dwn", "ax0"], ["dws"], keepdims=0),
                    ints("s8", [c, 1, k, k]), h.make_node("Reshape", ["dws", "s8"], ["dw"])]


def row_products(n: int, c: int, side: int, out: int, k: int, pad: int, stride: int = 1) -> list:
    """A depthwise kxk Conv's dW as ``_depthwise_weight_grad_rows`` takes it: dy's columns spread
    onto x's per kernel column by a 0/1 MatMul, times x's rows, summed over the images; each tap
    the sum of one diagonal of those row pairs."""
    shift = np.zeros((out, k, side), np.float32)
    for j in range(k):
        cols = np.arange(out) * stride + j - pad
        inside = (cols >= 0) & (cols < side)
        shift[np.arange(out)[inside], j, cols[inside]] = 1
    tail = max(0, stride * (out - 1) + k - pad - side)
    length = side + pad + tail
    i, j, o = np.meshgrid(np.arange(k), np.arange(k), np.arange(out), indexing="ij")
    nodes = [const("shift", shift.reshape(out, k * side)), h.make_node("MatMul", ["dy", "shift"], ["spread"]),
             ints("rs", [0, c, out * k, side]), h.make_node("Reshape", ["spread", "rs"], ["rows"]),
             h.make_node("Transpose", ["x"], ["xt"], perm=[0, 1, 3, 2]), h.make_node("MatMul", ["rows", "xt"], ["prod"]),
             ints("ax0", [0]), h.make_node("ReduceSum", ["prod", "ax0"], ["pairs0"], keepdims=0)]
    if pad or tail:
        nodes += [ints("pp", [0, 0, pad, 0, 0, tail]), h.make_node("Pad", ["pairs0", "pp"], ["pairs"])]
    return nodes + [ints("fl", [c, out * k * length]), h.make_node("Reshape", ["pairs" if pad or tail else "pairs0", "fl"], ["flat"]),
                    ints("dg", (o * k + j) * length + o * stride + i), h.make_node("Gather", ["flat", "dg"], ["taps"], axis=1),
                    ints("ax3", [3]), h.make_node("ReduceSum", ["taps", "ax3"], ["dws"], keepdims=0),
                    ints("s8", [c, 1, k, k]), h.make_node("Reshape", ["dws", "s8"], ["dw"])]


def banded_rows(c: int, side: int, out: int, k: int, stride: int, pad: int, src: str, dst: str, dx: bool) -> list:
    """A depthwise kxk Conv (``dx``: its input gradient) as two products: ``src``'s columns times
    w's taps laid out per channel as a banded [cols in, k*cols out] matrix (one Gather of w), then
    the rows by a 0/1 [rows out, rows in*k] matrix, which sums each kernel row's share."""
    a, b = (out, side) if dx else (side, out)  # columns of src, of dst
    col = np.full((a, k, b), k * k, np.int64)  # k*k: the zero appended to w's taps
    row = np.zeros((b, a, k), np.float32)
    for u, i, v in itertools.product(range(a), range(k), range(b)):
        q, wide = (u, v) if dx else (v, u)  # output column, input column
        if 0 <= wide - stride * q + pad < k:
            col[u, i, v] = i * k + wide - stride * q + pad
        o, r = (u, v) if dx else (v, u)  # output row, input row
        if r == stride * o + i - pad:
            row[v, u, i] = 1
    return [ints("sw", [c, k * k]), h.make_node("Reshape", ["w", "sw"], ["wf"]), const("wz0", np.zeros((c, 1))),
            h.make_node("Concat", ["wf", "wz0"], ["wz"], axis=1), ints("cx", col), h.make_node("Gather", ["wz", "cx"], ["band"], axis=1),
            ints("sb", [c, a, k * b]), h.make_node("Reshape", ["band", "sb"], ["bands"]),
            h.make_node("MatMul", [src, "bands"], ["cols"]), ints("sc", [0, c, a * k, b]),
            h.make_node("Reshape", ["cols", "sc"], ["colr"]), const("rows", row.reshape(b, a * k)),
            h.make_node("MatMul", ["rows", "colr"], [dst])]


def row_conv(args) -> None:
    """A depthwise Conv's forward and dx (Conv, ConvTranspose) vs ``banded_rows``."""
    for n, c, side, k, st in [(32, 96, 32, 3, 1), (32, 144, 32, 5, 1), (32, 32, 64, 3, 1), (32, 96, 64, 3, 2),
                              (32, 144, 32, 5, 2), (32, 240, 16, 3, 2), (2, 96, 64, 3, 2)]:
        p = k // 2
        out = (side + 2 * p - k) // st + 1
        x, w, dy = normal(n, c, side, side), normal(c, 1, k, k), normal(n, c, out, out)
        attrs = {"pads": [p] * 4, "strides": [st, st], "group": c}
        compare(f"N={n} {c}ch {side} {k}x{k} s{st} fwd", {
            "Conv": [h.make_node("Conv", ["x", "w"], ["y"], **attrs)],
            "rows": banded_rows(c, side, out, k, st, p, "x", "y", dx=False)}, {"x": x, "w": w}, ["y"], args)
        compare(f"N={n} {c}ch {side} {k}x{k} s{st} dx", {
            "ConvTranspose": [h.make_node("ConvTranspose", ["dy", "w"], ["dx"], output_shape=[side, side], **attrs)],
            "rows": banded_rows(c, side, out, k, st, p, "dy", "dx", dx=True)}, {"dy": dy, "w": w}, ["dx"], args)


def depthwise_product(args) -> None:
    """A depthwise Conv on a small map as ``dense_conv`` writes it, each channel's [N, Q] pixels
    times its dense [Q, P] matrix: onnxruntime's Einsum vs Transposes and a MatMul batched over
    the channels, forward, dx and the dense matrix's gradient (as autodiff derives them)."""
    for n, c, q, p in [(32, 576, 16, 16), (32, 240, 64, 64), (32, 96, 64, 16), (32, 1152, 16, 16), (2, 576, 16, 16)]:
        x, dy, m = normal(n, c, q), normal(n, c, p), normal(c, q, p)  # m: [C, Q, P]
        swap = [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2]), h.make_node("Transpose", ["dy"], ["dyt"], perm=[1, 0, 2])]
        compare(f"N={n} {c}ch Q={q} P={p} fwd", {
            "Einsum": [h.make_node("Einsum", ["x", "m"], ["y"], equation="ncq,cqp->ncp")],
            "MatMul": swap[:1] + [h.make_node("MatMul", ["xt", "m"], ["yt"]), h.make_node("Transpose", ["yt"], ["y"], perm=[1, 0, 2])]},
            {"x": x, "m": m}, ["y"], args)
        compare(f"N={n} {c}ch Q={q} P={p} dx", {
            "Einsum": [h.make_node("Einsum", ["dy", "m"], ["dx"], equation="ncp,cqp->ncq")],
            "MatMul": swap[1:] + [h.make_node("Transpose", ["m"], ["mt"], perm=[0, 2, 1]), h.make_node("MatMul", ["dyt", "mt"], ["dxt"]),
                                  h.make_node("Transpose", ["dxt"], ["dx"], perm=[1, 0, 2])]},
            {"dy": dy, "m": m}, ["dx"], args)
        compare(f"N={n} {c}ch Q={q} P={p} dM", {
            "Einsum": [h.make_node("Einsum", ["x", "dy"], ["dm"], equation="ncq,ncp->cqp")],
            "MatMul": swap + [h.make_node("Transpose", ["xt"], ["xtt"], perm=[0, 2, 1]), h.make_node("MatMul", ["xtt", "dyt"], ["dm"])]},
            {"x": x, "dy": dy}, ["dm"], args)


def depthwise_dw(args) -> None:
    for n, c, side, k in [(32, 96, 32, 3), (32, 144, 16, 3), (2, 96, 32, 3), (32, 144, 32, 3), (32, 240, 8, 3),
                          (32, 480, 4, 3), (32, 96, 32, 5), (32, 240, 8, 5), (32, 32, 64, 3), (32, 240, 16, 5),
                          (32, 96, 56, 3), (32, 16, 112, 3), (32, 1152, 4, 3), (32, 672, 4, 5), (4, 144, 16, 3),
                          (2, 32, 64, 3), (2, 480, 8, 3), (2, 1152, 4, 3), (2, 144, 16, 3), (2, 32, 224, 3)]:
        p = k // 2
        swapped = [h.make_node("Transpose", ["x"], ["xt0"], perm=[1, 0, 2, 3]), ints("s1", [1, c * n, side, side]),
                   h.make_node("Reshape", ["xt0", "s1"], ["xt"]), h.make_node("Transpose", ["dy"], ["dyt"], perm=[1, 0, 2, 3]),
                   h.make_node("Conv", ["xt", "dyt"], ["dw0"], pads=[p] * 4, group=c), ints("s2", [c, 1, k, k]),
                   h.make_node("Reshape", ["dw0", "s2"], ["dw"])]
        per_image = per_image_dw(n, c, side, side, k, [p] * 4)

        def tap_sums(src: str, grad: str, tag: str) -> tuple[list, str]:
            """Each tap's window of the padded ``src`` times ``grad``, summed to [C]; Concat-ed."""
            cut, slices = windows(src, tag, k, side)
            for t in slices:
                cut += [h.make_node("Mul", [t, grad], ["m" + t]),
                        h.make_node("ReduceSum", ["m" + t, "axes"], ["r" + t], keepdims=0)]
            return cut + [h.make_node("Concat", ["r" + t for t in slices], ["cat" + tag], axis=0)], "cat" + tag

        def as_weight(total: str) -> list:  # [K*C] tap-major -> [C, 1, k, k]
            return [ints("s3", [k * k, c]), h.make_node("Reshape", [total, "s3"], ["c2"]),
                    h.make_node("Transpose", ["c2"], ["ct"], perm=[1, 0]), ints("s4", [c, 1, k, k]),
                    h.make_node("Reshape", ["ct", "s4"], ["dw"])]

        head = [ints("pads", [0, 0, p, p, 0, 0, p, p]), ints("axes", [0, 2, 3]), ints("hw", [2, 3])]
        nodes, total = tap_sums("xp", "dy", "")
        taps = head + [h.make_node("Pad", ["x", "pads"], ["xp"])] + nodes + as_weight(total)
        chunked = head + [ints("n0", [0])]
        total = None
        for first in range(0, n, chunk := max(1, min(n, (1 << 20) // (c * side * side)))):
            q = f"_{first}"
            chunked += [ints("f" + q, [first]), ints("l" + q, [min(n, first + chunk)]),
                        h.make_node("Slice", ["x", "f" + q, "l" + q, "n0"], ["x" + q]),
                        h.make_node("Slice", ["dy", "f" + q, "l" + q, "n0"], ["dy" + q]),
                        h.make_node("Pad", ["x" + q, "pads"], ["xp" + q])]
            nodes, part = tap_sums("xp" + q, "dy" + q, q)
            chunked += nodes
            if total is not None:
                chunked.append(h.make_node("Add", [total, part], ["sum" + q]))
            total = "sum" + q if total is not None else part
        chunked += as_weight(total)
        compare(f"N={n} {c}ch {side}x{side} {k}x{k}", {"taps": taps, "swapped-conv": swapped, f"taps x{chunk}": chunked,
                                                      "per-image-conv": per_image, "rows": row_products(n, c, side, side, k, p)},
                {"x": normal(n, c, side, side), "dy": normal(n, c, side, side)}, ["dw"], args)


def _flipped(ci: int, co: int, k: int, group: int) -> list:
    """The weight w [Co, Ci/g, k, k] flipped in space, each group's channel axes swapped:
    ``wf`` [Ci, Co/g, k, k], the kernel of the Conv (``group`` g) that gives a stride-1 Conv's dx."""
    nodes = [ints("st", [0, 0, k - 1, k - 1]), ints("en", [co, 2 ** 30, -k - 1, -k - 1]), ints("ax", [0, 1, 2, 3]),
             ints("step", [1, 1, -1, -1]), h.make_node("Slice", ["w", "st", "en", "ax", "step"], ["wf0"])]
    if ci // group == 1:  # depthwise: a Reshape ([C, m, k, k])
        return nodes + [ints("ws", [ci, co // group, k, k]), h.make_node("Reshape", ["wf0", "ws"], ["wf"])]
    return nodes + [ints("w5", [group, co // group, ci // group, k, k]), h.make_node("Reshape", ["wf0", "w5"], ["wf1"]),
                    h.make_node("Transpose", ["wf1"], ["wf2"], perm=[0, 2, 1, 3, 4]),
                    ints("ws", [ci, co // group, k, k]), h.make_node("Reshape", ["wf2", "ws"], ["wf"])]


def conv_dx(args) -> None:
    for n, ci, co, side, k, group in [(32, 96, 96, 32, 3, 96), (32, 144, 144, 32, 3, 144), (32, 96, 96, 64, 3, 96),
                                      (32, 144, 144, 16, 3, 144), (32, 240, 240, 16, 3, 240), (32, 480, 480, 8, 3, 480),
                                      (32, 144, 144, 16, 5, 144), (32, 240, 240, 16, 5, 240), (32, 672, 672, 8, 5, 672),
                                      (32, 1152, 1152, 4, 5, 1152), (2, 96, 96, 32, 3, 96),
                                      (32, 64, 64, 32, 3, 1), (32, 128, 128, 16, 3, 1), (32, 256, 256, 8, 3, 1),
                                      (32, 64, 64, 16, 3, 1), (32, 128, 128, 8, 3, 1), (32, 256, 256, 4, 3, 1),
                                      (32, 512, 512, 2, 3, 1), (2, 64, 64, 16, 3, 1), (32, 48, 48, 16, 3, 6),
                                      (32, 104, 104, 8, 3, 13), (32, 208, 208, 4, 3, 26), (32, 440, 440, 2, 3, 55),
                                      (2, 104, 104, 8, 3, 13), (32, 96, 192, 32, 3, 96)]:
        p = k // 2
        transposed = [h.make_node("ConvTranspose", ["dy", "w"], ["dx"], pads=[p] * 4, group=group)]
        flipped = _flipped(ci, co, k, group) + [h.make_node("Conv", ["dy", "wf"], ["dx"], pads=[k - 1 - p] * 4, group=group)]
        kind = "dw" if group == ci else "dense" if group == 1 else f"g{group}"
        compare(f"N={n} {kind} {ci}->{co} {side}x{side} {k}x{k}", {"conv-transpose": transposed, "flipped-conv": flipped},
                {"dy": normal(n, co, side, side), "w": normal(co, ci // group, k, k)}, ["dx"], args)
    for n, c, side, k in [(32, 96, 64, 3), (32, 144, 32, 5), (32, 240, 16, 3), (32, 672, 8, 5), (2, 96, 64, 3)]:
        p, half = k // 2, side // 2  # stride 2: dy on the half grid, spread over the full one with zeros
        transposed = [h.make_node("ConvTranspose", ["dy", "w"], ["dx"], pads=[p] * 4, strides=[2, 2], group=c,
                                  output_padding=[1, 1])]
        spread = [ints("s1", [n, c, half, 1, half, 1]), h.make_node("Reshape", ["dy", "s1"], ["d6"]),
                  ints("zp", [0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0, 1]), h.make_node("Pad", ["d6", "zp"], ["d6p"]),
                  ints("s2", [n, c, side, side]), h.make_node("Reshape", ["d6p", "s2"], ["dz"])]
        flipped = spread + _flipped(c, c, k, c) + [h.make_node("Conv", ["dz", "wf"], ["dx"], pads=[k - 1 - p] * 4, group=c)]
        compare(f"N={n} dw s2 {c} {side}x{side} {k}x{k}", {"conv-transpose": transposed, "spread-flipped-conv": flipped},
                {"dy": normal(n, c, half, half), "w": normal(c, 1, k, k)}, ["dx"], args)


def gathered_conv(args) -> None:
    """Dense stride-1 3x3 Convs on mid-sized maps (``rules_nn.gathers_conv``): the forward as a
    Conv vs the gathered columns times the weight, and its dx as a ConvTranspose vs the same
    product on dy, its taps reversed, by the weight with its channel axes swapped."""
    for n, c, side in [(32, 64, 8), (32, 128, 8), (32, 256, 8), (16, 256, 8), (8, 256, 8), (32, 128, 12),
                       (32, 256, 7), (32, 64, 16), (32, 128, 16), (2, 256, 8)]:
        compare(f"fwd N={n} {c}ch {side}x{side}", {"conv": [h.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4)],
                                                  "gathered": gathered_product("x", "w", "y", c, c, side, 3, 1)},
                {"x": normal(n, c, side, side), "w": normal(c, c, 3, 3)}, ["y"], args)
        compare(f"dx N={n} {c}ch {side}x{side}", {"conv-transpose": [h.make_node("ConvTranspose", ["dy", "w"], ["dx"],
                                                                                 pads=[1] * 4)],
                                                 "gathered": [h.make_node("Transpose", ["w"], ["ws"], perm=[1, 0, 2, 3])]
                                                 + gathered_product("dy", "ws", "dx", c, c, side, 3, 1, flip=True)},
                {"dy": normal(n, c, side, side), "w": normal(c, c, 3, 3)}, ["dx"], args)


def grouped_conv(args) -> None:
    """Grouped 3x3 Convs (group width 8, RegNetY-400MF's at 128 and 64 px), against their Conv
    and ConvTranspose: the forward and the stride-1 dx (a Conv by the flipped weight,
    ``rules_nn._flipped_input_grad``) as gathered columns times the weight, batched over the
    groups; the stride-2 dx as sub-pixel phases (one Conv of dy by the 2x2 phase kernels, channel
    (c, phase) within each group, then DepthToSpace)."""
    for n, c, side, st, group in [(32, 48, 64, 2, 6), (32, 104, 32, 2, 13), (32, 104, 16, 1, 13), (32, 208, 16, 2, 26),
                                  (32, 208, 8, 1, 26), (32, 104, 8, 1, 13), (8, 104, 16, 1, 13), (2, 104, 16, 1, 13)]:
        cg, out = c // group, (side + 2 - 3) // st + 1
        w = normal(c, cg, 3, 3)
        compare(f"fwd N={n} g{group} {c}ch {side} s{st}",
                {"conv": [h.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4, strides=[st, st], group=group)],
                 "gathered": gathered_product("x", "w", "y", c, c, side, 3, 1, group=group, stride=st)},
                {"x": normal(n, c, side, side), "w": w}, ["y"], args)
        if st == 1:
            flipped = _flipped(c, c, 3, group)
            compare(f"dx N={n} g{group} {c}ch {side} s1",
                    {"flipped-conv": flipped + [h.make_node("Conv", ["dy", "wf"], ["dx"], pads=[1] * 4, group=group)],
                     "gathered": flipped + gathered_product("dy", "wf", "dx", c, c, side, 3, 1, group=group)},
                    {"dy": normal(n, c, side, side), "w": w}, ["dx"], args)
            continue
        # phase (r, s) of dx: row r of the 2x2 kernel over dy rows (i, i+1) reads taps [1, -] (r=0)
        # or [2, 0] (r=1), likewise for columns; tap 3 is a zero
        taps = np.array([[1, 3], [2, 0]])
        wp = np.zeros((c, cg, 4, 4), np.float32)
        wp[:, :, :3, :3] = w
        phases = np.zeros((group, cg, 2, 2, c // group, 2, 2), np.float32)  # [g, ci, r, s, m, a, b]
        for g, ci, r, s_, m in itertools.product(range(group), range(cg), range(2), range(2), range(c // group)):
            phases[g, ci, r, s_, m] = wp[g * (c // group) + m, ci][np.ix_(taps[r], taps[s_])]
        compare(f"dx N={n} g{group} {c}ch {side} s2",
                {"conv-transpose": [h.make_node("ConvTranspose", ["dy", "w"], ["dx"], pads=[1] * 4, strides=[2, 2],
                                                group=group, output_padding=[1, 1])],
                 "phases": [const("wph", phases.reshape(c * 4, c // group, 2, 2)),
                            h.make_node("Conv", ["dy", "wph"], ["ph"], pads=[0, 0, 1, 1], group=group),
                            h.make_node("DepthToSpace", ["ph"], ["dx"], blocksize=2, mode="CRD")]},
                {"dy": normal(n, c, out, out), "w": w}, ["dx"], args)


def dense_dw(args) -> None:
    """A dense kxk Conv's dW as im2col + one GEMM: the window slices stacked one spatial axis at a
    time (sum(K) Slices, two Concats, as ``_conv_weight_grad_im2col``) vs all at once (prod(K))."""
    for n, ci, co, side, k, st in [(32, 64, 64, 16, 3, 1), (32, 128, 128, 8, 3, 1), (32, 256, 256, 4, 3, 1),
                                   (32, 64, 128, 16, 3, 2), (32, 3, 64, 64, 7, 2), (2, 64, 64, 16, 3, 1)]:
        p, out = k // 2, (side + 2 * (k // 2) - k) // st + 1
        head = [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2, 3]), ints("pads", [0, 0, p, p, 0, 0, p, p]),
                h.make_node("Pad", ["xt", "pads"], ["xp"]), h.make_node("Transpose", ["dy"], ["dyt"], perm=[1, 0, 2, 3]),
                ints("dys", [co, -1]), h.make_node("Reshape", ["dyt", "dys"], ["dy2"]), ints("cs", [ci * k * k, -1]),
                ints("ws", [co, ci, k, k]), ints("ax2", [2]), ints("ax3", [3]), ints("ax4", [4]), ints("ax5", [5]),
                ints("one", [1]), ints("two", [2]), ints("st", [st])]
        tail = [h.make_node("Reshape", ["cols", "cs"], ["colmat"]), h.make_node("Gemm", ["dy2", "colmat"], ["g"], transB=1),
                h.make_node("Reshape", ["g", "ws"], ["dw"])]
        staged = list(head)
        rows = []
        for i in range(k):
            staged += [ints(f"rb{i}", [i]), ints(f"re{i}", [i + (out - 1) * st + 1]),
                       h.make_node("Slice", ["xp", f"rb{i}", f"re{i}", "ax2", "st"], [f"r{i}"]),
                       h.make_node("Unsqueeze", [f"r{i}", "one"], [f"ru{i}"])]
            rows.append(f"ru{i}")
        staged.append(h.make_node("Concat", rows, ["rows"], axis=1))  # [Ci, K, N, O, W+2p]
        cols = []
        for j in range(k):
            staged += [h.make_node("Slice", ["rows", f"rb{j}", f"re{j}", "ax4", "st"], [f"c{j}"]),
                       h.make_node("Unsqueeze", [f"c{j}", "two"], [f"cu{j}"])]
            cols.append(f"cu{j}")
        staged += [h.make_node("Concat", cols, ["cols"], axis=2)] + tail
        flat = head + [ints("hw", [2, 3]), ints("st2", [st, st])]
        nodes, slices = windows("xp", "", k, out, st)
        flat += nodes + [h.make_node("Unsqueeze", [t, "one"], ["u" + t]) for t in slices]
        flat += [h.make_node("Concat", ["u" + t for t in slices], ["cols"], axis=1)] + tail
        variants = {"staged": staged, "all-at-once": flat, "gathered": gathered_dw(n, ci, co, side, k, st),
                    "gathered padded grid": gathered_dw(n, ci, co, side, k, st, zero_row=False)}
        if st == 1:  # each tap one contiguous run of whole padded rows; dy padded to their width
            wp = side + 2 * p
            rows_ = head + [ints("padr", [0, 0, p, p, 0, 0, p + 1, p]), h.make_node("Pad", ["xt", "padr"], ["xr"]),
                            ints("fl", [ci, 1, n, -1]), h.make_node("Reshape", ["xr", "fl"], ["xf"]),
                            ints("padd", [0, 0, 0, 0, 0, 0, 0, wp - out]), h.make_node("Pad", ["dyt", "padd"], ["dyp"]),
                            h.make_node("Reshape", ["dyp", "dys"], ["dyr"]), ints("a3", [3])]
            taps = []
            for i, j in itertools.product(range(k), range(k)):
                rows_ += [ints(f"fb{i}{j}", [i * wp + j]), ints(f"fe{i}{j}", [i * wp + j + out * wp]),
                          h.make_node("Slice", ["xf", f"fb{i}{j}", f"fe{i}{j}", "a3"], [f"f{i}{j}"])]
                taps.append(f"f{i}{j}")
            rows_ += [h.make_node("Concat", taps, ["cols"], axis=1), h.make_node("Reshape", ["cols", "cs"], ["colmat"]),
                      h.make_node("Gemm", ["dyr", "colmat"], ["g"], transB=1), h.make_node("Reshape", ["g", "ws"], ["dw"])]
            variants["row-runs"] = rows_
        compare(f"N={n} {ci}->{co} {side}x{side} {k}x{k} s{st}", variants,
                {"x": normal(n, ci, side, side), "dy": normal(n, co, out, out)}, ["dw"], args)


def large_dw(args) -> None:
    """A dense kxk Conv's dW where the whole batch's columns pass the im2col's cap: the Conv over x
    with batch and channels swapped (dy as the kernel) vs im2col + GEMM over ``chunk`` images at a
    time, each chunk's GEMM adding into the last one's result (Gemm's C)."""
    for n, ci, co, side, k, st, chunks in [(32, 64, 64, 32, 3, 1, (4, 8)), (32, 64, 128, 64, 3, 2, (4, 8)),
                                           (32, 3, 32, 128, 3, 1, (4, 8)), (32, 3, 64, 64, 7, 2, (8, 32)),
                                           (2, 3, 64, 64, 7, 2, (2,)), (32, 3, 64, 128, 7, 2, (4,)),
                                           (32, 3, 64, 64, 7, 1, (4, 8))]:
        p, out = k // 2, (side + 2 * (k // 2) - k) // st + 1
        head = [ints("pads", [0, 0, p, p, 0, 0, p, p]), h.make_node("Transpose", ["dy"], ["dyt"], perm=[1, 0, 2, 3]),
                ints("ws", [co, ci, k, k]), ints("one", [1]), ints("hw", [2, 3]), ints("st2", [st, st]),
                ints("n0", [0]), ints("cs", [ci * k * k, -1]), ints("dys", [co, -1])]
        swapped = head + [h.make_node("Transpose", ["x"], ["xs"], perm=[1, 0, 2, 3]),
                          h.make_node("Conv", ["xs", "dyt"], ["dws"], strides=[1, 1], dilations=[st, st],
                                      pads=[p, p, p, p]),
                          h.make_node("Transpose", ["dws"], ["dwt"], perm=[1, 0, 2, 3]),
                          ints("kk", [k, k]), ints("z2", [0, 0]),
                          h.make_node("Slice", ["dwt", "z2", "kk", "hw"], ["dw"])]
        variants = {"swapped Conv": swapped, "gathered": gathered_dw(n, ci, co, side, k, st)}
        for chunk in chunks:
            nodes = list(head)
            acc = None
            for c0 in range(0, n, chunk):
                tag = f"_{c0}"
                nodes += [ints("b" + tag, [c0]), ints("e" + tag, [c0 + chunk]),
                          h.make_node("Slice", ["x", "b" + tag, "e" + tag, "n0"], ["xc" + tag]),
                          h.make_node("Transpose", ["xc" + tag], ["xt" + tag], perm=[1, 0, 2, 3]),
                          h.make_node("Pad", ["xt" + tag, "pads"], ["xp" + tag]),
                          h.make_node("Slice", ["dyt", "b" + tag, "e" + tag, "one"], ["dyc" + tag]),
                          h.make_node("Reshape", ["dyc" + tag, "dys"], ["dy2" + tag])]
                cut, slices = windows("xp" + tag, tag, k, out, st)
                nodes += cut + [h.make_node("Unsqueeze", [t, "one"], ["u" + t]) for t in slices]
                nodes += [h.make_node("Concat", ["u" + t for t in slices], ["cols" + tag], axis=1),
                          h.make_node("Reshape", ["cols" + tag, "cs"], ["cm" + tag]),
                          h.make_node("Gemm", ["dy2" + tag, "cm" + tag] + ([acc] if acc else []), ["g" + tag],
                                      transB=1)]
                acc = "g" + tag
            nodes.append(h.make_node("Reshape", [acc, "ws"], ["dw"]))
            variants[f"im2col x{chunk}"] = nodes
        # per tap: one Gemm of dy against the tap's window, taps stacked on a [Co, Ci, K] result
        nodes = head + [h.make_node("Transpose", ["x"], ["xt"], perm=[1, 0, 2, 3]),
                        h.make_node("Pad", ["xt", "pads"], ["xp"]), h.make_node("Reshape", ["dyt", "dys"], ["dy2"]),
                        ints("cim", [ci, -1]), ints("two", [2])]
        cut, slices = windows("xp", "", k, out, st)
        nodes += cut
        for t in slices:
            nodes += [h.make_node("Reshape", [t, "cim"], ["m" + t]), h.make_node("Gemm", ["dy2", "m" + t], ["g" + t], transB=1),
                      h.make_node("Unsqueeze", ["g" + t, "two"], ["u" + t])]
        nodes += [h.make_node("Concat", ["u" + t for t in slices], ["gs"], axis=2), h.make_node("Reshape", ["gs", "ws"], ["dw"])]
        variants["per-tap Gemm"] = nodes
        compare(f"N={n} {ci}->{co} {side}x{side} {k}x{k} s{st}", variants,
                {"x": normal(n, ci, side, side), "dy": normal(n, co, out, out)}, ["dw"], args)


def grouped_dw(args) -> None:
    """A grouped 3x3 Conv's dW (RegNetY-400MF's group width 8 at 128 and 64 px): the Conv over x
    with each group's channels as its batch and the groups over the batch as its channels, dy as
    the kernel (``_groups_over_batch``), vs the gathered columns into one MatMul batched over the
    groups."""
    for n, c, side, st, group in [(32, 48, 64, 2, 6), (32, 104, 32, 2, 13), (32, 104, 16, 1, 13), (32, 208, 16, 2, 26),
                                  (32, 208, 8, 1, 26), (32, 48, 32, 2, 6), (32, 104, 8, 1, 13), (2, 48, 32, 2, 6),
                                  (2, 104, 16, 1, 13), (2, 208, 8, 1, 26)]:
        cg, out = c // group, (side + 2 - 3) // st + 1
        swapped = [ints("x5", [n, group, cg, side, side]), h.make_node("Reshape", ["x", "x5"], ["xg"]),
                   h.make_node("Transpose", ["xg"], ["xgt"], perm=[2, 1, 0, 3, 4]), ints("xs", [cg, -1, side, side]),
                   h.make_node("Reshape", ["xgt", "xs"], ["xt"]), h.make_node("Transpose", ["dy"], ["dyt"], perm=[1, 0, 2, 3]),
                   h.make_node("Conv", ["xt", "dyt"], ["dws"], dilations=[st, st], pads=[1] * 4, group=group),
                   h.make_node("Transpose", ["dws"], ["dwt"], perm=[1, 0, 2, 3]),  # [C, cg, 3 or 4, ...]: cut to 3x3
                   ints("z2", [0, 0]), ints("kk", [3, 3]), ints("hw", [2, 3]),
                   h.make_node("Slice", ["dwt", "z2", "kk", "hw"], ["dw"])]
        compare(f"N={n} g{group} {c}ch {side}x{side} s{st}", {"swapped Conv": swapped,
                                                             "gathered": gathered_dw(n, c, c, side, 3, st, group)},
                {"x": normal(n, c, side, side), "dy": normal(n, c, out, out)}, ["dw"], args)


def batch_dw(args) -> None:
    """A dense 3x3 Conv's dW at ResNet-18/50's and the stems' shapes at 64 px, batches 2, 8, 32:
    the gathered columns as ``_conv_weight_grad_gathered`` takes them now (the columns as the
    Gemm's A, dy as its B, one Transpose to dW) vs the Conv over swapped axes (dy its kernel,
    ``rules_nn._conv_weight_grad``'s last form) on the generic kernel vs on the NCHWc kernels
    (``graphc.backends.nchwc.rewrite``, every Conv it can run)."""
    from graphc.backends import nchwc as blocked

    block = blocked.block_size()
    for n in (2, 8, 32):
        for ci, co, side, st in [(3, 32, 64, 2), (64, 64, 16, 1), (64, 128, 16, 2), (128, 128, 8, 1),
                                 (128, 256, 8, 2), (256, 256, 4, 1), (256, 512, 4, 2), (512, 512, 2, 1)]:
            out = (side + 2 - 3) // st + 1
            nodes, cols = gathered_columns("x", "x_", ci, side, 3, st, 1)
            gathered = nodes + [h.make_node("Transpose", ["dy"], ["dyg"], perm=[1, 2, 3, 0]), ints("gdys", [co, -1]),
                                h.make_node("Reshape", ["dyg", "gdys"], ["dyg2"]),
                                h.make_node("Gemm", [cols, "dyg2"], ["gg"], transB=1), ints("gws", [ci, 3, 3, co]),
                                h.make_node("Reshape", ["gg", "gws"], ["gw4"]),
                                h.make_node("Transpose", ["gw4"], ["dw"], perm=[3, 0, 1, 2])]
            full = (side + 2 - (out - 1) * st - 1) + 1  # the swapped Conv's taps, cut to 3x3 where more
            swapped = [h.make_node("Transpose", ["x"], ["xs"], perm=[1, 0, 2, 3]),
                       h.make_node("Transpose", ["dy"], ["dyt"], perm=[1, 0, 2, 3]),
                       h.make_node("Conv", ["xs", "dyt"], ["dws"], dilations=[st, st], pads=[1] * 4),
                       h.make_node("Transpose", ["dws"], ["dwt" if full != 3 else "dw"], perm=[1, 0, 2, 3])]
            if full != 3:
                swapped += [ints("z2", [0, 0]), ints("kk", [3, 3]), ints("hw", [2, 3]),
                            h.make_node("Slice", ["dwt", "z2", "kk", "hw"], ["dw"])]
            feeds = {"x": normal(n, ci, side, side), "dy": normal(n, co, out, out)}
            variants = {"gathered": gathered, "swapped": swapped}
            if block:
                graph = h.make_graph(swapped, "dw", [h.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape)
                                                     for k, v in feeds.items()],
                                     [h.make_tensor_value_info("dw", onnx.TensorProto.FLOAT, None)])
                rewritten, count = blocked.rewrite(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), block,
                                                   only_faster=False)
                if count:
                    variants["swapped nchwc"] = list(rewritten.graph.node)
            compare(f"N={n} {ci}->{co} {side}x{side} s{st}", variants, feeds, ["dw"], args)


def reaching_pads(args) -> None:
    """A stride-2 depthwise Conv's dW as one Conv grouped by image and channel (dy as its
    kernels, dilated by the stride): with the forward's end pads, which reach a tap past the
    kernel (computed, then cut by a Slice), vs end pads that reach its last tap."""
    for n, c, side, k in [(32, 96, 64, 3), (32, 144, 32, 5), (32, 240, 16, 3), (32, 672, 8, 5), (2, 96, 64, 3),
                          (32, 16, 128, 3)]:
        p, out = k // 2, side // 2
        reaching = max(0, k + 2 * (out - 1) - side - p)
        compare(f"N={n} {c}ch {side}x{side} {k}x{k}", {**{f"end pad {e}": per_image_dw(n, c, side, out, k, [p, p, e, e], 2)
                                                        for e in (p, reaching)}, "rows": row_products(n, c, side, out, k, p, 2)},
                {"x": normal(n, c, side, side), "dy": normal(n, c, out, out)}, ["dw"], args)


def nchwc(args) -> None:
    """A Conv whose weight is an input on onnxruntime's generic kernel vs the same Conv on its
    NCHWc kernels, input and output reordered and the weight reordered in the graph
    (``graphc.backends.nchwc``, which only rewrites those it measured faster)."""
    from graphc.backends import nchwc as blocked

    block = blocked.block_size()
    if not block:
        print("  onnxruntime has no NCHWc kernels on this CPU")
        return

    def variants(conv: onnx.NodeProto, feeds: dict[str, np.ndarray]) -> dict[str, list]:
        """The one Conv as it is and as ``graphc.backends.nchwc`` rewrites it (every one it can)."""
        graph = h.make_graph([conv], "conv", [h.make_tensor_value_info(k, onnx.TensorProto.FLOAT, v.shape)
                                              for k, v in feeds.items()],
                             [h.make_tensor_value_info(conv.output[0], onnx.TensorProto.FLOAT, None)])
        rewritten, _ = blocked.rewrite(h.make_model(graph, opset_imports=[h.make_opsetid("", 17)]), block,
                                       only_faster=False)
        return {"generic": [conv], "nchwc": list(rewritten.graph.node)}

    cases = [(32, 64, 64, 32, 3, 1, 1), (32, 256, 256, 8, 3, 1, 1), (32, 128, 128, 8, 3, 1, 1), (16, 256, 256, 8, 3, 1, 1),
             (8, 64, 64, 32, 3, 1, 1), (2, 128, 128, 16, 3, 1, 1), (8, 256, 256, 8, 3, 1, 1), (32, 64, 256, 32, 1, 1, 1),
             (32, 3, 64, 128, 7, 2, 1), (32, 96, 96, 64, 3, 2, 96),
             (32, 144, 144, 32, 3, 1, 144), (32, 240, 240, 16, 5, 1, 240), (32, 672, 672, 8, 5, 1, 672),
             (2, 144, 144, 16, 3, 1, 144)]
    for n, ci, co, side, k, stride, group in cases:
        feeds = {"x": normal(n, ci, side, side), "w": normal(co, ci // group, k, k)}
        conv = h.make_node("Conv", ["x", "w"], ["y"], pads=[k // 2] * 4, strides=[stride] * 2, group=group)
        compare(f"{n} {ci}->{co} {side}² {k}x{k}/{stride}" + (" dw" if group > 1 else ""), variants(conv, feeds),
                feeds, ["y"], args)
    for n, c, side, k, stride in [(32, 144, 32, 3, 1), (32, 96, 64, 3, 2), (32, 240, 16, 5, 1)]:
        # a depthwise dW as rules_nn._depthwise_weight_grad_per_image takes it: x's images' channels
        # as the groups of one image, dy as the kernel, strides as dilations
        out = (side + 2 * (k // 2) - k) // stride + 1
        feeds = {"x": normal(1, n * c, side, side), "dy": normal(n * c, 1, out, out)}
        conv = h.make_node("Conv", ["x", "dy"], ["dw"], group=n * c, pads=[k // 2] * 4, dilations=[stride] * 2)
        compare(f"dW {n}x{c}ch {side}² {k}x{k}/{stride}", variants(conv, feeds), feeds, ["dw"], args)


def unfold(args) -> None:
    """``F.unfold``/``F.fold`` of [8, 64, 32, 32] by 3x3 (pad 1), forward + ``gc.grad`` backward."""
    import graphc as gc
    import graphc.nn.functional as F

    n, c, side, k = 8, 64, 32, 3
    hot = np.eye(k * k, dtype=np.float32).reshape(k * k, 1, k, k)

    def batched_unfold(x):  # N*C one-channel images, an ungrouped Conv by the k*k one-hot taps
        return gc.reshape(F.conv2d(gc.reshape(x, [-1, 1, side, side]), hot, padding=1), [-1, c * k * k, side * side])

    def sliced_unfold(x):
        padded = F.pad(x, (1, 1, 1, 1))
        taps = [padded[:, :, i:i + side, j:j + side] for i in range(k) for j in range(k)]
        return gc.reshape(gc.stack(taps, 2), [-1, c * k * k, side * side])

    def batched_fold(cols):
        image = F.conv_transpose2d(gc.reshape(cols, [-1, k * k, side, side]), hot, padding=1)
        return gc.reshape(image, [-1, c, side, side])

    def padded_fold(cols):
        taps = gc.reshape(cols, [-1, c, k * k, side, side])
        total = sum(F.pad(taps[:, :, i * k + j], (j, k - 1 - j, i, k - 1 - i)) for i in range(k) for j in range(k))
        return total[:, :, 1:1 + side, 1:1 + side]

    class Loss(gc.nn.Module):  # sum(fn(x) * w): its gradient is the backward of fn
        def __init__(self, fn, x):
            super().__init__()
            self.fn, self.x = fn, gc.nn.Parameter(x)

        def forward(self, w):
            return {"loss": gc.sum(self.fn(self.x) * w)}

    for label, x, out_shape, variants in [
            ("unfold", normal(n, c, side, side), (n, c * k * k, side * side),
             {"grouped": lambda x: F.unfold(x, k, padding=1), "batched": batched_unfold, "slices": sliced_unfold}),
            ("fold", normal(n, c * k * k, side * side), (n, c, side, side),
             {"grouped": lambda x: F.fold(x, side, k, padding=1), "batched": batched_fold, "pads": padded_fold})]:
        w = normal(*out_shape)
        models = {name: gc.grad(gc.capture(Loss(fn, x), w=w), "loss").proto for name, fn in variants.items()}
        compare(f"{label} {n}x{c}ch {side}² {k}x{k}", models, {"x": x, "w": w}, ["loss", "x_grad"], args)


def int_power(args) -> None:
    """``a ** b`` of int32/int64 [1M] by a Tensor ``b``: ``integer_powers.integer_power``'s alternatives."""
    import torch

    import graphc as gc
    from graphc.dsl.ops import cast, emit, reduction

    def squarings(dtype: str, low_bit: str, halve: str, looped: bool) -> Callable:
        """``a ** b`` (``b >= 0``) by square and multiply: ``low_bit`` Mod or BitwiseAnd, ``halve`` Div or a
        uint BitShift, as many steps as the dtype's bits or a Loop while the largest power has bits left."""
        def fn(a, b):
            left = cast(b, "u" + dtype) if halve == "shift" else b
            one, two = gc.ones([], dtype=left.dtype), gc.full([], 2, dtype=left.dtype)

            def step(out, base, left):
                bit = emit("Mod", [left, two]) == one if low_bit == "mod" else cast(emit("BitwiseAnd", [left, one]),
                                                                                   "bool")
                half = emit("Div", [left, two]) if halve == "div" else emit("BitShift", [left, one],
                                                                             {"direction": "RIGHT"})
                return gc.where(bit, out * base, out), base * base, half

            state = (a * 0 + 1, a, left)
            if not looped:
                for _ in range(np.iinfo(dtype).bits - 1):
                    state = step(*state)
                return state[0]
            top = reduction("ReduceMax", b, None, False)  # onnxruntime has no uint64 ReduceMax
            return gc.while_loop(lambda *s: s[-1] > 0, lambda *s: (*step(*s[:3]), s[3] // 2), (*state, top))[0]
        return fn

    torch.set_num_threads(args.threads)
    n = 1 << 20
    for dtype in ("int32", "int64"):
        info = np.iinfo(dtype)
        a = RNG.integers(info.min, info.max, n, dtype=dtype, endpoint=True)
        for label, top in (("small", 8), ("full-range", info.max)):
            b = RNG.integers(0, top, n, dtype=dtype, endpoint=True)
            spec = {"a": gc.spec(dtype, [n]), "b": gc.spec(dtype, [n])}
            pow_node = h.make_node("Pow", ["a", "b"], ["output"])
            kind = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
            graph = h.make_graph([pow_node], "pow", [h.make_tensor_value_info(k, kind, [n]) for k in "ab"],
                                 [h.make_tensor_value_info("output", kind, [n])])
            models = {"Pow": h.make_model(graph, opset_imports=[h.make_opsetid("", 21)], ir_version=10)}
            for name, fn in {"masked": squarings(dtype, "mod", "div", False),
                             "loop": lambda a, b: a ** b,  # graphc's lowering
                             "loop-and": squarings(dtype, "and", "div", True),
                             "loop-and-shift": squarings(dtype, "and", "shift", True)}.items():
                models[name] = gc.capture(fn, **spec).proto
            ta, tb = torch.from_numpy(a), torch.from_numpy(b)
            want = (ta ** tb).numpy()
            got = session(models["loop"], {"a": a, "b": b}, ["output"], args).run(None, {"a": a, "b": b})[0]
            np.testing.assert_array_equal(got, want, err_msg=f"int_power {dtype} {label}: graphc vs torch")
            compare(f"{dtype} {label}", models, {"a": a, "b": b}, ["output"], args, unchecked=("Pow",),
                    others={"torch": lambda: torch.pow(ta, tb)})


CASES: dict[str, Callable] = {"bn": bn, "bn_stats": bn_stats, "bn_sums": bn_sums, "bn_passes": bn_passes, "silu": silu, "gelu": gelu, "layer_norm": layer_norm, "leading_sum": leading_sum, "hardswish": hardswish, "relu": relu, "bn_affine": bn_affine, "max_pool": max_pool, "pointwise_dx": pointwise_dx, "pointwise_dw": pointwise_dw,
                              "strided_pointwise_dx": strided_pointwise_dx, "depthwise_dw": depthwise_dw,
                              "conv_dx": conv_dx, "gathered_conv": gathered_conv, "dense_dw": dense_dw,
                              "large_dw": large_dw, "batch_dw": batch_dw, "grouped_dw": grouped_dw, "grouped_conv": grouped_conv,
                              "reaching_pads": reaching_pads, "row_conv": row_conv,
                              "depthwise_product": depthwise_product, "nchwc": nchwc, "unfold": unfold,
                              "int_power": int_power}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=15)
    p.add_argument("--only", default=",".join(CASES), help=f"comma-separated, of: {', '.join(CASES)}")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cuda: onnxruntime's CUDA provider, each variant replayed as a CUDA graph, TF32 off")
    args = p.parse_args()
    for name in args.only.split(","):
        where = f"{args.threads} thread(s)" if args.device == "cpu" else "CUDA graphs"
        print(f"{name} (ms, {where}):")
        CASES[name](args)


if __name__ == "__main__":
    main()
