"""numpy kernels against onnxruntime on random inputs, by op family, float32 and float64.

float64 runs wherever onnxruntime's CPU provider has a double kernel (it has none for Conv,
Gelu, Elu, Selu, Softplus, PRelu, LeakyRelu, HardSigmoid, Mean, global pools, InstanceNorm).
"""

from __future__ import annotations

import numpy as np
import pytest

from numpy_backend_util import numpy_vs_ort

F32, F64 = np.float32, np.float64
rng = np.random.default_rng(0)


def r(*shape, lo=-2.0, hi=2.0):
    return lambda dt: rng.uniform(lo, hi, shape).astype(dt)


def pos(*shape):
    return r(*shape, lo=0.1, hi=3.0)


def ints(values, dt=np.int64):
    return lambda _: np.array(values, dtype=dt)


def boolean(*shape):
    return lambda _: rng.random(shape) > 0.5


# (id, op, input makers, attrs, opset, dtypes, n_outputs)
CASES = [
    # elementwise
    ("add_bcast", "Add", [r(3, 4), r(4)], {}, 21, (F32, F64), 1),
    ("sub", "Sub", [r(2, 3, 4), r(3, 1)], {}, 21, (F32, F64), 1),
    ("mul", "Mul", [r(3, 4), r(3, 4)], {}, 21, (F32, F64), 1),
    ("div", "Div", [r(3, 4), pos(3, 4)], {}, 21, (F32, F64), 1),
    ("div_int", "Div", [ints([[7, -7, 9]]), ints([2, 2, -4])], {}, 21, (F32,), 1),
    ("pow", "Pow", [pos(3, 4), r(3, 4)], {}, 21, (F32, F64), 1),
    ("neg", "Neg", [r(5)], {}, 21, (F32, F64), 1),
    ("abs", "Abs", [r(5)], {}, 21, (F32, F64), 1),
    ("sqrt", "Sqrt", [pos(5)], {}, 21, (F32, F64), 1),
    ("exp", "Exp", [r(5)], {}, 21, (F32, F64), 1),
    ("log", "Log", [pos(5)], {}, 21, (F32, F64), 1),
    ("reciprocal", "Reciprocal", [pos(5)], {}, 21, (F32, F64), 1),
    ("sign", "Sign", [r(7)], {}, 21, (F32, F64), 1),
    ("floor", "Floor", [r(7)], {}, 21, (F32, F64), 1),
    ("ceil", "Ceil", [r(7)], {}, 21, (F32, F64), 1),
    ("round", "Round", [lambda dt: np.array([0.5, 1.5, 2.5, -0.5, 1.2], dt)], {}, 21, (F32, F64), 1),
    ("relu", "Relu", [r(3, 4)], {}, 21, (F32, F64), 1),
    # axis == rank gives [N, 1] (BERT from the TorchScript exporter), not [1, N]
    *[(f"flatten_axis{axis}", "Flatten", [r(2, 3, 4)], {"axis": axis}, 21, (F32,), 1) for axis in (3, 0, -1, -3)],
    ("sigmoid", "Sigmoid", [r(50, lo=-30, hi=30)], {}, 21, (F32, F64), 1),
    ("tanh", "Tanh", [r(50, lo=-5, hi=5)], {}, 21, (F32, F64), 1),
    ("erf", "Erf", [r(200, lo=-4, hi=4)], {}, 21, (F32,), 1),
    ("gelu", "Gelu", [r(100, lo=-5, hi=5)], {}, 20, (F32,), 1),
    ("gelu_tanh", "Gelu", [r(100, lo=-5, hi=5)], {"approximate": "tanh"}, 20, (F32,), 1),
    ("leaky_relu", "LeakyRelu", [r(20)], {"alpha": 0.2}, 21, (F32,), 1),
    ("elu", "Elu", [r(20)], {"alpha": 0.7}, 21, (F32,), 1),
    ("selu", "Selu", [r(20)], {}, 21, (F32,), 1),
    ("hard_sigmoid", "HardSigmoid", [r(20, lo=-5, hi=5)], {}, 21, (F32,), 1),
    ("hard_swish", "HardSwish", [r(20, lo=-5, hi=5)], {}, 21, (F32,), 1),
    ("softplus", "Softplus", [r(20, lo=-30, hi=30)], {}, 21, (F32,), 1),
    ("prelu", "PRelu", [r(2, 3, 4), r(3, 1)], {}, 21, (F32,), 1),
    ("clip_inputs", "Clip", [r(20), lambda dt: np.array(-0.5, dt), lambda dt: np.array(0.7, dt)], {}, 13, (F32, F64), 1),
    ("clip_attrs_v6", "Clip", [r(20)], {"min": -0.5, "max": 0.7}, 6, (F32,), 1),
    ("where", "Where", [boolean(3, 4), r(3, 4), r(4)], {}, 21, (F32, F64), 1),
    ("max", "Max", [r(3, 4), r(4), r(3, 1)], {}, 21, (F32, F64), 1),
    ("min", "Min", [r(3, 4), r(4)], {}, 21, (F32, F64), 1),
    ("sum", "Sum", [r(3, 4), r(4), r(3, 4)], {}, 21, (F32, F64), 1),
    ("mean", "Mean", [r(3, 4), r(3, 4)], {}, 21, (F32,), 1),
    ("equal", "Equal", [ints([1, 2, 3]), ints([1, 0, 3])], {}, 21, (F32,), 1),
    ("less", "Less", [r(3, 4), r(4)], {}, 21, (F32, F64), 1),
    ("greater", "Greater", [r(3, 4), r(4)], {}, 21, (F32, F64), 1),
    ("not", "Not", [boolean(5)], {}, 21, (F32,), 1),
    ("and", "And", [boolean(3, 4), boolean(4)], {}, 21, (F32,), 1),
    ("or", "Or", [boolean(3, 4), boolean(4)], {}, 21, (F32,), 1),
    ("mod_int", "Mod", [ints([5, -5, 7, -7]), ints([3, 3, -2, -2])], {}, 21, (F32,), 1),
    ("mod_fmod", "Mod", [r(6), pos(6)], {"fmod": 1}, 21, (F32, F64), 1),
    ("cast_int", "Cast", [r(6, lo=-9, hi=9)], {"to": 6}, 21, (F32, F64), 1),
    ("cast_double", "Cast", [r(6)], {"to": 11}, 21, (F32,), 1),
    # reductions
    ("reduce_sum_13", "ReduceSum", [r(3, 4, 5), ints([0, 2])], {"keepdims": 0}, 13, (F32, F64), 1),
    ("reduce_sum_11", "ReduceSum", [r(3, 4, 5)], {"axes": [1]}, 11, (F32, F64), 1),
    ("reduce_mean_18", "ReduceMean", [r(3, 4, 5), ints([-1])], {}, 18, (F32, F64), 1),
    ("reduce_mean_13", "ReduceMean", [r(3, 4, 5)], {"axes": [0, 1], "keepdims": 0}, 13, (F32, F64), 1),
    ("reduce_max", "ReduceMax", [r(3, 4, 5), ints([1])], {}, 18, (F32, F64), 1),
    ("reduce_min_all", "ReduceMin", [r(3, 4, 5)], {"keepdims": 0}, 18, (F32, F64), 1),
    ("reduce_prod", "ReduceProd", [r(3, 4), ints([1])], {}, 18, (F32, F64), 1),
    ("reduce_l2", "ReduceL2", [r(3, 4), ints([1])], {}, 18, (F32, F64), 1),
    ("reduce_lse", "ReduceLogSumExp", [r(3, 4, lo=-50, hi=50), ints([1])], {}, 18, (F32, F64), 1),
    # noop_with_empty_axes: no reduction, the op's elementwise part still applied (x^2, |x|, log x)
    *((f"{op.lower()}_noop{'' if axes else '_no_axes'}", op, [pos(3, 4) if op == "ReduceLogSum" else r(3, 4),
       *([ints([])] if axes else [])], {"noop_with_empty_axes": 1}, 18, (F32, F64), 1)
      for op in ("ReduceSumSquare", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp", "ReduceMean",
                 "ReduceMax", "ReduceMin", "ReduceProd") for axes in (True, False)),
    ("reducesum_noop", "ReduceSum", [r(3, 4), ints([])], {"noop_with_empty_axes": 1}, 13, (F32, F64), 1),
    ("argmax_last", "ArgMax", [ints([[1, 3, 3], [2, 2, 0]], np.float32)], {"axis": 1, "select_last_index": 1}, 21, (F32,), 1),
    ("argmin", "ArgMin", [r(3, 4)], {"axis": 0, "keepdims": 0}, 21, (F32, F64), 1),
    ("softmax", "Softmax", [r(2, 3, 4, lo=-20, hi=20)], {"axis": 1}, 21, (F32, F64), 1),
    ("log_softmax", "LogSoftmax", [r(2, 3, 4)], {"axis": -1}, 21, (F32, F64), 1),
    ("cumsum", "CumSum", [r(3, 4), ints(1)], {"exclusive": 1, "reverse": 1}, 21, (F32, F64), 1),
    ("topk", "TopK", [r(3, 6), ints([2])], {"axis": 1}, 21, (F32, F64), 2),
    ("topk_smallest", "TopK", [r(3, 6), ints([3])], {"axis": 0, "largest": 0}, 21, (F32,), 2),
    # linear algebra
    ("matmul_batched", "MatMul", [r(2, 3, 4, 5), r(5, 6)], {}, 21, (F32, F64), 1),
    ("matmul_vec", "MatMul", [r(5), r(2, 5, 3)], {}, 21, (F32, F64), 1),
    ("gemm", "Gemm", [r(4, 3), r(5, 4), r(5)], {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, 21, (F32, F64), 1),
    ("einsum", "Einsum", [r(2, 3, 4), r(2, 4, 5)], {"equation": "bij,bjk->bik"}, 21, (F32, F64), 1),
    # conv and pooling
    ("conv_pads_strides", "Conv", [r(2, 3, 9, 8), r(4, 3, 3, 2), r(4)], {"pads": [1, 0, 2, 1], "strides": [2, 1]}, 21, (F32,), 1),
    ("conv_dilated_groups", "Conv", [r(1, 4, 10, 10), r(6, 2, 3, 3)], {"group": 2, "dilations": [2, 1]}, 21, (F32,), 1),
    ("conv_depthwise", "Conv", [r(2, 4, 7, 7), r(4, 1, 3, 3)], {"group": 4, "pads": [1, 1, 1, 1]}, 21, (F32,), 1),
    ("conv_same_upper", "Conv", [r(1, 2, 7, 6), r(3, 2, 3, 3)], {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, 21, (F32,), 1),
    ("conv_1d", "Conv", [r(2, 3, 11), r(5, 3, 4), r(5)], {"pads": [1, 2], "strides": [2]}, 21, (F32,), 1),
    ("conv_3d", "Conv", [r(1, 2, 5, 5, 5), r(3, 2, 2, 3, 2)], {}, 21, (F32,), 1),
    ("conv_transpose", "ConvTranspose", [r(2, 3, 4, 5), r(3, 2, 3, 3), r(2)], {"strides": [2, 2], "pads": [1, 0, 0, 1], "output_padding": [1, 0]}, 21, (F32,), 1),
    ("conv_transpose_group", "ConvTranspose", [r(1, 4, 3, 3), r(4, 1, 2, 2)], {"group": 2, "dilations": [2, 1]}, 21, (F32,), 1),
    ("conv_transpose_shape", "ConvTranspose", [r(1, 1, 3, 3), r(1, 2, 3, 3)], {"strides": [3, 2], "output_shape": [10, 8]}, 21, (F32,), 1),
    ("maxpool_ceil", "MaxPool", [r(2, 3, 7, 7)], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, 21, (F32, F64), 1),
    ("maxpool_pads_dil", "MaxPool", [r(1, 2, 8, 8)], {"kernel_shape": [2, 3], "pads": [1, 1, 0, 1], "dilations": [2, 1]}, 21, (F32,), 1),
    ("maxpool_indices", "MaxPool", [r(2, 2, 6, 5)], {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [0, 0, 0, 1]}, 21, (F32,), 2),
    ("avgpool_exclude_pad", "AveragePool", [r(2, 3, 7, 6)], {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "strides": [2, 2]}, 21, (F32,), 1),
    ("avgpool_include_pad", "AveragePool", [r(2, 3, 7, 6)], {"kernel_shape": [3, 2], "pads": [1, 0, 1, 1], "count_include_pad": 1}, 21, (F32,), 1),
    # auto_pad's pads count too, as onnxruntime, onnx.reference and PyTorch's padded avg_pool2d count them
    *[(f"avgpool_include_pad_{pad.lower()}", "AveragePool", [r(1, 2, 5, 6)],
       {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": pad, "count_include_pad": 1}, 19, (F32,), 1)
      for pad in ("SAME_UPPER", "SAME_LOWER")],
    ("avgpool_ceil", "AveragePool", [r(1, 1, 6, 6)], {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, 21, (F32,), 1),
    ("global_avg", "GlobalAveragePool", [r(2, 3, 5, 4)], {}, 21, (F32,), 1),
    ("global_max", "GlobalMaxPool", [r(2, 3, 5, 4)], {}, 21, (F32,), 1),
    # normalization
    ("batchnorm_15", "BatchNormalization", [r(2, 3, 4, 4), r(3), r(3), r(3), pos(3)], {"epsilon": 1e-3}, 15, (F32, F64), 1),
    ("layernorm", "LayerNormalization", [r(2, 5, 8), r(8), r(8)], {"axis": -1}, 17, (F32, F64), 3),
    ("layernorm_axis1", "LayerNormalization", [r(2, 5, 8), r(5, 8)], {"axis": 1, "epsilon": 1e-3}, 17, (F32,), 1),
    ("instancenorm", "InstanceNormalization", [r(2, 3, 5, 4), r(3), r(3)], {}, 21, (F32,), 1),
    ("lrn", "LRN", [r(2, 5, 3, 3)], {"size": 3, "alpha": 0.01}, 21, (F32,), 1),
    # shape and indexing
    ("reshape", "Reshape", [r(2, 3, 4), ints([0, -1])], {}, 21, (F32,), 1),
    ("transpose", "Transpose", [r(2, 3, 4)], {"perm": [2, 0, 1]}, 21, (F32, F64), 1),
    ("concat", "Concat", [r(2, 3), r(2, 1), r(2, 2)], {"axis": -1}, 21, (F32,), 1),
    ("split_18", "Split", [r(6, 4)], {"axis": 0, "num_outputs": 3}, 18, (F32,), 3),
    ("split_13", "Split", [r(6, 4), ints([1, 3])], {"axis": 1}, 13, (F32,), 2),
    ("slice_neg_step", "Slice", [r(5, 6), ints([4, -1]), ints([0, -7]), ints([0, 1]), ints([-2, -2])], {}, 21, (F32,), 1),
    ("squeeze", "Squeeze", [r(1, 3, 1, 2), ints([0, 2])], {}, 21, (F32,), 1),
    ("unsqueeze", "Unsqueeze", [r(3, 2), ints([-1, 0])], {}, 21, (F32,), 1),
    ("expand", "Expand", [r(3, 1), ints([2, 1, 4])], {}, 21, (F32,), 1),
    ("tile", "Tile", [r(2, 3), ints([2, 2])], {}, 21, (F32,), 1),
    ("pad_reflect", "Pad", [r(3, 4), ints([1, 2, 1, 0])], {"mode": "reflect"}, 21, (F32,), 1),
    ("pad_edge_axes", "Pad", [r(2, 3, 4), ints([2, 1]), None, ints([1])], {"mode": "edge"}, 21, (F32,), 1),
    ("pad_constant", "Pad", [r(3, 4), ints([0, 1, 2, -1]), lambda dt: np.array(1.5, dt)], {}, 21, (F32,), 1),
    ("gather_neg", "Gather", [r(5, 3), ints([[0, -1], [2, 4]])], {"axis": 0}, 21, (F32,), 1),
    ("gather_elements", "GatherElements", [r(3, 4), ints([[0, 3], [1, -1], [2, 2]])], {"axis": 1}, 21, (F32,), 1),
    ("gather_nd_batch", "GatherND", [r(2, 3, 4), ints([[[1], [0]], [[2], [1]]])], {"batch_dims": 1}, 21, (F32,), 1),
    ("gather_nd_full_index", "GatherND", [r(2, 3, 4), ints([1, -1, 2])], {}, 21, (F32,), 1),  # a scalar
    ("gather_nd_empty_index", "GatherND", [r(2, 3, 4), ints(np.zeros((2, 0)))], {}, 21, (F32,), 1),
    ("gather_nd_empty_index_batch", "GatherND", [r(2, 3, 4), ints(np.zeros((2, 3, 0)))], {"batch_dims": 1}, 21,
     (F32,), 1),
    ("gather_elements_smaller", "GatherElements", [r(2, 3, 4), ints([[[1, 0], [1, 1]]])], {"axis": 0}, 21, (F32,), 1),
    ("gather_elements_smaller_neg", "GatherElements", [r(2, 3, 4), ints([[[-1, 0], [1, 3]]])], {"axis": 2}, 21,
     (F32,), 1),
    ("scatter_elements_add", "ScatterElements", [r(3, 4), ints([[0, 1], [0, 3]]), r(2, 2)], {"axis": 1, "reduction": "add"}, 21, (F32,), 1),
    ("scatter_nd", "ScatterND", [r(4, 3), ints([[1], [3]]), r(2, 3)], {}, 21, (F32,), 1),
    ("one_hot", "OneHot", [ints([1, 0, -1]), ints(4), lambda dt: np.array([0, 5], dt)], {"axis": 0}, 21, (F32,), 1),
    ("range", "Range", [lambda dt: np.array(1, dt), lambda dt: np.array(7.5, dt), lambda dt: np.array(1.5, dt)], {}, 21, (F32, F64), 1),
    ("depth_to_space", "DepthToSpace", [r(1, 8, 2, 3)], {"blocksize": 2, "mode": "CRD"}, 21, (F32,), 1),
    ("nonzero", "NonZero", [ints([[1, 0, 2], [0, 3, 0]])], {}, 21, (F32,), 1),
    ("trilu", "Trilu", [r(4, 5), ints(1)], {"upper": 0}, 21, (F32,), 1),
    ("resize_linear", "Resize", [r(1, 2, 4, 5), None, ints([1, 1, 1.5, 0.6], np.float32)], {"mode": "linear"}, 21, (F32,), 1),
    ("resize_nearest_sizes", "Resize", [r(1, 1, 3, 4), None, None, ints([1, 1, 7, 5])], {"coordinate_transformation_mode": "asymmetric", "nearest_mode": "floor"}, 21, (F32,), 1),
    ("resize_cubic_align", "Resize", [r(1, 1, 4, 4), None, ints([1, 1, 2, 2], np.float32)], {"mode": "cubic", "coordinate_transformation_mode": "align_corners"}, 21, (F32,), 1),
    # losses, attention, quantization
    ("nll_loss_weighted", "NegativeLogLikelihoodLoss", [r(4, 5, 3), ints([[0, 4, 1], [2, 2, -1], [3, 1, 0], [4, 0, 2]]), pos(5)], {"ignore_index": -1}, 21, (F32, F64), 1),
    ("softmax_ce", "SoftmaxCrossEntropyLoss", [r(6, 4), ints([0, 3, 1, 2, 2, 0])], {"reduction": "sum"}, 21, (F32, F64), 2),
    ("softmax_ce_none", "SoftmaxCrossEntropyLoss", [r(3, 4, 2), ints([[0, 3], [1, 1], [2, 0]])], {"reduction": "none"}, 21, (F32,), 1),
    ("rms_norm", "RMSNormalization", [r(2, 3, 8), r(8)], {}, 23, (F32,), 1),
    ("attention_causal_gqa", "Attention", [r(2, 4, 3, 8), r(2, 2, 5, 8), r(2, 2, 5, 8)], {"is_causal": 1}, 23, (F32,), 1),
    ("attention_3d_mask", "Attention", [r(2, 3, 16), r(2, 5, 16), r(2, 5, 8), boolean(3, 5)], {"q_num_heads": 4, "kv_num_heads": 4}, 23, (F32,), 1),
    ("attention_past", "Attention", [r(1, 2, 2, 4), r(1, 2, 2, 4), r(1, 2, 2, 4), None, r(1, 2, 3, 4), r(1, 2, 3, 4)], {"is_causal": 1}, 23, (F32,), 3),
    ("dequantize_axis", "DequantizeLinear", [ints([[1, 200], [3, 40]], np.uint8), lambda dt: np.array([0.5, 2.0], np.float32), ints([1, 128], np.uint8)], {"axis": 1}, 21, (F32,), 1),
    ("quantize", "QuantizeLinear", [r(3, 4, lo=-5, hi=5), lambda dt: np.array(0.05, np.float32), ints(3, np.int8)], {}, 21, (F32,), 1),
    # recurrent
    ("lstm_bidirectional", "LSTM", [r(5, 2, 3), r(2, 16, 3), r(2, 16, 4), r(2, 32), None, r(2, 2, 4), r(2, 2, 4)], {"hidden_size": 4, "direction": "bidirectional"}, 21, (F32,), 3),
    ("lstm_seq_lens", "LSTM", [r(4, 3, 2), r(1, 12, 2), r(1, 12, 3), None, ints([4, 2, 3], np.int32)], {"hidden_size": 3}, 21, (F32,), 3),
    ("gru_lbr", "GRU", [r(5, 2, 3), r(1, 12, 3), r(1, 12, 4), r(1, 24)], {"hidden_size": 4, "linear_before_reset": 1}, 21, (F32,), 2),
    ("gru_reverse", "GRU", [r(4, 2, 3), r(1, 9, 3), r(1, 9, 3)], {"hidden_size": 3, "direction": "reverse"}, 21, (F32,), 2),
    ("rnn", "RNN", [r(4, 2, 3), r(1, 5, 3), r(1, 5, 5)], {"hidden_size": 5}, 21, (F32,), 2),
    ("lstm_clip_peepholes", "LSTM", [r(4, 2, 3), r(1, 16, 3), r(1, 16, 4), r(1, 32), None, r(1, 2, 4), r(1, 2, 4),
                                      r(1, 12)], {"hidden_size": 4, "clip": 0.6}, 21, (F32,), 3),
    ("lstm_clip_input_forget", "LSTM", [r(4, 2, 3), r(1, 16, 3), r(1, 16, 4)], {"hidden_size": 4, "clip": 0.8,
                                                                               "input_forget": 1}, 21, (F32,), 3),
    ("gru_clip_activations", "GRU", [r(4, 2, 3), r(1, 9, 3), r(1, 9, 3), r(1, 18)],
     {"hidden_size": 3, "clip": 0.9, "activations": ["HardSigmoid", "ScaledTanh"], "activation_alpha": [0.3, 1.2],
      "activation_beta": [0.4, 0.7]}, 21, (F32,), 2),
    ("rnn_clip_lens", "RNN", [r(4, 3, 3), r(1, 5, 3), r(1, 5, 5), None, ints([4, 1, 2], np.int32)],
     {"hidden_size": 5, "clip": 0.5, "direction": "reverse"}, 21, (F32,), 2),
    # align_corners divides by the output's own (floored) length, as onnxruntime and PyTorch do
    *[(f"resize_align_corners_floored_{mode}", "Resize",
       [r(1, 2, 3, 4), None, lambda dt: np.array([1, 1, 1.7, 0.6], np.float32)],
       {"mode": mode, "coordinate_transformation_mode": "align_corners"}, 19, (F32,), 1)
      for mode in ("linear", "cubic", "nearest")],
    # tf_half_pixel_for_nn (opsets 11-17): x_in = (x_out + 0.5) / scale; scales without ties at float32 vs float64
    *[(f"resize_tf_half_pixel_for_nn_{mode}_{nearest}_{i}", "Resize",
       [r(1, 2, 4, 5), None, lambda dt, s=scales: np.array([1, 1, *s], np.float32)],
       {"mode": mode, "nearest_mode": nearest, "coordinate_transformation_mode": "tf_half_pixel_for_nn"}, 13, (F32,), 1)
      for mode, nearest in [("nearest", n) for n in ("round_prefer_floor", "round_prefer_ceil", "floor", "ceil")]
      + [("linear", "round_prefer_floor")]
      for i, scales in enumerate([(1.5, 0.8), (2.0, 3.0), (0.5, 0.75)])],
    ("resize_policy_align_corners", "Resize", [r(2, 4, 3), None, None, ints([5, 7])],
     {"mode": "linear", "axes": [2, 1], "keep_aspect_ratio_policy": "not_larger",
      "coordinate_transformation_mode": "align_corners"}, 19, (F32,), 1),
    # sampling: every mode, padding and alignment, grid points far outside the image too
    *[(f"grid_sample_{mode}_{padding}_align{align}", "GridSample", [r(2, 2, 4, 5), r(2, 3, 4, 2, lo=-3.5, hi=3.5)],
       {"mode": mode, "padding_mode": padding, "align_corners": align}, 22, (F32,), 1)
      for mode in ("linear", "nearest", "cubic") for padding in ("zeros", "border", "reflection") for align in (0, 1)],
    *[(f"grid_sample_3d_{mode}_{padding}", "GridSample", [r(1, 2, 3, 4, 2), r(1, 2, 3, 2, 3, lo=-3.5, hi=3.5)],
       {"mode": mode, "padding_mode": padding}, 22, (F32,), 1)
      for mode in ("linear", "nearest") for padding in ("zeros", "border", "reflection")],
]

PARAMS = [pytest.param(op, makers, attrs, opset, dt, n, id=f"{cid}-{np.dtype(dt).name}")
          for cid, op, makers, attrs, opset, dtypes, n in CASES for dt in dtypes]


@pytest.mark.parametrize(("op_type", "makers", "attrs", "opset", "dtype", "n_outputs"), PARAMS)
def test_kernel_matches_onnxruntime(op_type, makers, attrs, opset, dtype, n_outputs):
    inputs = [None if m is None else m(dtype) for m in makers]
    got, want = numpy_vs_ort(op_type, inputs, attrs, opset, n_outputs)
    tol = {"rtol": 1e-4, "atol": 1e-5} if dtype == F32 else {"rtol": 1e-9, "atol": 1e-11}
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        np.testing.assert_allclose(g, w, **tol)


@pytest.mark.parametrize("v", [3.0, -2.6, 0.5])
def test_float64_erf_of_a_0d_input_past_the_series(v):
    """The float64 Erf kernel writes its continued fraction's values into the series' result: a 0-d one too."""
    import math

    import graphc as gc

    x = np.array(v)
    got = gc.Session(gc.capture(lambda x: gc.erf(x), x=x), backend="numpy").run({"x": x})["output"]
    assert got.shape == () and abs(float(got) - math.erf(v)) < 1e-15
