"""Double-precision Tan, Sinh, Cosh, Asin, Acos, Atan, Asinh, Acosh, Atanh, Erf, Gelu and Det written out for
onnxruntime, in a session's copy of a model; and a training-mode Dropout's scaling.

onnxruntime 1.31 has no double kernel for these ("Could not find an implementation for Tan(7)"), and so
cannot load a model with one. The session's copy computes each from ops it has double kernels for (Sin,
Cos, Exp, Log, Sqrt, arithmetic, Where), within a few ulps of the correctly rounded value
(``tests/test_backend_double.py`` measures each):

- tan by Cephes' rational approximation after reduction to |x| <= pi/4 by pi/4 in three parts (onnxruntime's
  double Sin and Cos lose relative accuracy near their zeros: 1.7e-11 near 2 pi), sin / cos past 2^30;
- cosh and sinh from h = exp(|x| / 2), e^|x| / 2 = (h / 2) * h (finite wherever they are), sinh below
  |x| = 1 by its Taylor series (no cancellation);
- atan by Cephes' rational approximation after its reduction to |x| <= 0.66, asin x = atan(x / sqrt((1 - x)
  (1 + x))), acos x = 2 atan(sqrt((1 - x) / (1 + x)));
- asinh, acosh, atanh through ``Writer.log1p``, log(x) + log 2 past 2^28;
- erf by Cephes' rational approximations: erf below |x| = 1, 1 - erfc above; Gelu by its definition through it
  (``gc.optimize`` fuses float64 ``x/2 (1 + erf(x/sqrt 2))`` into one, and torch's opset-20 exports write one);
- Det by Gaussian elimination with partial pivoting, unrolled for the matrix's static size (a symbolic size
  raises ``BackendError``);
- Dropout in training mode: onnxruntime's double kernel scales the kept values by a float32 ``1 / (1 - ratio)``
  (1.7e-8 relative off at ratio 0.3); its Dropout still draws the mask (the same elements dropped), and the kept
  values are divided by ``1 - ratio`` in double, as the numpy backend's.

Nodes in any graph (Loop and Scan bodies, If branches too); float, float16 and bfloat16 ones run on
onnxruntime's kernels.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import helper

from graphc.backends import doubles_activations, doubles_layers, doubles_recurrent, doubles_windows, mvn
from graphc.backends.written_out import Writer, lower_doubles
from graphc.errors import BackendError
from graphc.model import node_label, node_source
from graphc.model.inferred import TypesOf, tensor_types

__all__ = ["lower_double"]

# Cephes atan.c: atan(x) = x + x^3 P(x^2) / Q(x^2) for |x| <= 0.66 (Q monic, leading 1 left out)
_ATAN_P = [-8.750608600031904122785e-1, -1.615753718733365076637e1, -7.500855792314704667340e1,
           -1.228866684490136173410e2, -6.485021904942025371773e1]
_ATAN_Q = [2.485846490142306297962e1, 1.650270098316988542046e2, 4.328810604912902668951e2,
           4.853903996359136964868e2, 1.945506571482613964425e2]
_MOREBITS = 6.123233995736765886130e-17  # pi/2 - double(pi/2)
_TAN_3PI_8 = 2.41421356237309504880
# Cephes tan.c: tan(z) = z + z^3 P(z^2) / Q(z^2) for |z| <= pi/4; pi/4 = DP1 + DP2 + DP3, j DP1 exact below 2^30
_TAN_P = [-1.30936939181383777646e4, 1.15351664838587416140e6, -1.79565251976484877988e7]
_TAN_Q = [1.36812963470692954678e4, -1.32089234440210967447e6, 2.50083801823357915839e7, -5.38695755929454629881e7]
_PI_4_PARTS = [7.853981554508209228515625e-1, 7.94662735614792836714e-9, 3.06161699786838294307e-17]
_TAN_LOSS = 1.073741824e9
# Cephes ndtr.c: erf(x) = x T(x^2) / U(x^2) for |x| < 1; erfc(x) = exp(-x^2) P(x) / Q(x) for 1 <= x < 8
_ERF_T = [9.60497373987051638749e0, 9.00260197203842689217e1, 2.23200534594684319226e3,
          7.00332514112805075473e3, 5.55923013010394962768e4]
_ERF_U = [3.35617141647503099647e1, 5.21357949780152679795e2, 4.59432382970980127987e3,
          2.26290000613890934246e4, 4.92673942608635921086e4]
_ERFC_P = [2.46196981473530512524e-10, 5.64189564831068821977e-1, 7.46321056442269912687e0,
           4.86371970985681366614e1, 1.96520832956077098242e2, 5.26445194995477358631e2,
           9.34528527171957607540e2, 1.02755188689515710272e3, 5.57535335369399327526e2]
_ERFC_Q = [1.32281951154744992508e1, 8.67072140885989742329e1, 3.54937778887819891062e2,
           9.75708501743205489753e2, 1.82390916687909736289e3, 2.24633760818710981792e3,
           1.65666309194161350182e3, 5.57535340817727675546e2]
# ndtr.c's erfc(x) = exp(-x^2) R(x) / S(x) for x >= 8
_ERFC_R = [5.64189583547755073984e-1, 1.27536670759978104416e0, 5.01905042251180477414e0,
           6.16021097993053585195e0, 7.40974269950448939160e0, 2.97886665372100240670e0]
_ERFC_S = [2.26052863220117276590e0, 9.39603524938001434673e0, 1.20489539808096656605e1,
           1.70814450747565897222e1, 9.60896809063285878198e0, 3.36907645100081516050e0]
_SINH_TAYLOR = [1 / math.factorial(2 * k + 1) for k in range(8, -1, -1)]  # x^17/17! .. x; the next is < 1e-17
_HUGE = 2.0 ** 28  # past it sqrt(x^2 +- 1) == |x| in double


def _c(w: Writer, value: float) -> str:
    return w.const(value, np.float64)


def _poly(w: Writer, z: str, coefs: list[float], monic: bool = False) -> str:
    """Horner: coefs[0] z^k + ... + coefs[k], with a leading z^(k+1) more when ``monic``."""
    acc = w.op("Add", z, _c(w, coefs[0])) if monic else _c(w, coefs[0])
    for c in coefs[1:]:
        acc = w.op("Add", w.op("Mul", acc, z), _c(w, c))
    return acc


def _signed(w: Writer, x: str, magnitude: str, output: str | None = None) -> str:
    """``magnitude`` with the sign of ``x`` (odd functions computed on |x|)."""
    return w.op("Where", w.op("Less", x, _c(w, 0.0)), w.op("Neg", magnitude), magnitude, output=output)


def _log_huge(w: Writer, a: str, otherwise: str, output: str | None = None) -> str:
    """log(a) + log 2 where a > 2^28 (asinh, acosh there), else ``otherwise``."""
    huge = w.op("Add", w.op("Log", a), _c(w, math.log(2.0)))
    return w.op("Where", w.op("Greater", a, _c(w, _HUGE)), huge, otherwise, output=output)


def _atan(w: Writer, x: str, output: str | None = None) -> str:
    a = w.op("Abs", x)
    big, mid = w.op("Greater", a, _c(w, _TAN_3PI_8)), w.op("Greater", a, _c(w, 0.66))
    one = _c(w, 1.0)
    reduced = w.op("Where", big, w.op("Div", _c(w, -1.0), a),
                   w.op("Where", mid, w.op("Div", w.op("Sub", a, one), w.op("Add", a, one)), a))
    base = w.op("Where", big, _c(w, math.pi / 2), w.op("Where", mid, _c(w, math.pi / 4), _c(w, 0.0)))
    extra = w.op("Where", big, _c(w, _MOREBITS), w.op("Where", mid, _c(w, _MOREBITS / 2), _c(w, 0.0)))
    z = w.op("Mul", reduced, reduced)
    ratio = w.op("Div", w.op("Mul", z, _poly(w, z, _ATAN_P)), _poly(w, z, _ATAN_Q, monic=True))
    r = w.op("Add", w.op("Mul", reduced, ratio), reduced)
    return _signed(w, x, w.op("Add", base, w.op("Add", r, extra)), output)


def _exp_halves(w: Writer, x: str) -> tuple[str, str]:
    """e^|x| / 2 and e^-|x| / 2, from h = exp(|x| / 2)."""
    h = w.op("Exp", w.op("Mul", w.op("Abs", x), _c(w, 0.5)))
    return w.op("Mul", w.op("Mul", h, _c(w, 0.5)), h), w.op("Div", w.op("Div", _c(w, 0.5), h), h)


def _tan(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x = node.input[0]
    a = w.op("Abs", x)
    j = w.op("Floor", w.op("Mul", a, _c(w, 4 / math.pi)))
    j = w.op("Add", j, w.op("Mod", j, _c(w, 2.0), fmod=1))  # even: z = a - j pi/4 in [-pi/4, pi/4]
    z = a
    for part in _PI_4_PARTS:
        z = w.op("Sub", z, w.op("Mul", j, _c(w, part)))
    zz = w.op("Mul", z, z)
    t = w.op("Add", z, w.op("Mul", z, w.op("Div", w.op("Mul", zz, _poly(w, zz, _TAN_P)),
                                         _poly(w, zz, _TAN_Q, monic=True))))
    # j = 2 mod 4: tan(a) = -1 / tan(z)
    odd = w.op("Equal", w.op("Mod", j, _c(w, 4.0), fmod=1), _c(w, 2.0))
    reduced = _signed(w, x, w.op("Where", odd, w.op("Div", _c(w, -1.0), t), t))
    w.op("Where", w.op("Greater", a, _c(w, _TAN_LOSS)), w.op("Div", w.op("Sin", x), w.op("Cos", x)), reduced,
         output=node.output[0])


def _cosh(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    w.op("Add", *_exp_halves(w, node.input[0]), output=node.output[0])


def _sinh(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x = node.input[0]
    large = _signed(w, x, w.op("Sub", *_exp_halves(w, x)))
    taylor = w.op("Mul", x, _poly(w, w.op("Mul", x, x), _SINH_TAYLOR))
    w.op("Where", w.op("Less", w.op("Abs", x), _c(w, 1.0)), taylor, large, output=node.output[0])


def _atan_node(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    _atan(w, node.input[0], node.output[0])


def _asin(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x, one = node.input[0], _c(w, 1.0)
    cos = w.op("Sqrt", w.op("Mul", w.op("Sub", one, x), w.op("Add", one, x)))
    _atan(w, w.op("Div", x, cos), node.output[0])


def _acos(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x, one = node.input[0], _c(w, 1.0)
    half = _atan(w, w.op("Sqrt", w.op("Div", w.op("Sub", one, x), w.op("Add", one, x))))
    w.op("Mul", half, _c(w, 2.0), output=node.output[0])


def _asinh(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x = node.input[0]
    a = w.op("Abs", x)
    a2 = w.op("Mul", a, a)
    # asinh a = log1p(a + sqrt(1 + a^2) - 1), the - 1 taken exactly as a^2 / (1 + sqrt(1 + a^2))
    u = w.op("Add", a, w.op("Div", a2, w.op("Add", _c(w, 1.0), w.op("Sqrt", w.op("Add", a2, _c(w, 1.0))))))
    _signed(w, x, _log_huge(w, a, w.log1p(u)), node.output[0])


def _acosh(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x = node.input[0]
    below = w.op("Sub", x, _c(w, 1.0))  # exact near 1
    # sqrt(x - 1) sqrt(x + 1): NaN below 1 (the product of the two is positive again below -1)
    u = w.op("Add", below, w.op("Mul", w.op("Sqrt", below), w.op("Sqrt", w.op("Add", x, _c(w, 1.0)))))
    _log_huge(w, x, w.log1p(u), node.output[0])


def _atanh(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x = node.input[0]
    a = w.op("Abs", x)
    u = w.op("Div", w.op("Add", a, a), w.op("Sub", _c(w, 1.0), a))
    _signed(w, x, w.op("Mul", w.log1p(u), _c(w, 0.5)), node.output[0])


def _erf(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    _erf_of(w, node.input[0], node.output[0])


def _erfc_held(w: Writer, a: str, upto: float) -> str:
    """erfc(a) for a >= 1 (P/Q below 8, R/S from 8 on), ``a`` held to [1, upto] so unused branches stay finite."""
    def part(lo: float, hi: float, p: list[float], q: list[float]) -> str:
        held = w.op("Min", w.op("Max", a, _c(w, lo)), _c(w, hi))
        return w.op("Div", w.op("Mul", w.op("Exp", w.op("Neg", w.op("Mul", held, held))), _poly(w, held, p)),
                    _poly(w, held, q, monic=True))
    if upto <= 8:
        return part(1.0, upto, _ERFC_P, _ERFC_Q)
    return w.op("Where", w.op("Less", a, _c(w, 8.0)), part(1.0, 8.0, _ERFC_P, _ERFC_Q),
                part(8.0, upto, _ERFC_R, _ERFC_S))


def _erf_of(w: Writer, x: str, output: str | None = None) -> str:
    a = w.op("Abs", x)
    z = w.op("Mul", x, x)
    small = w.op("Div", w.op("Mul", x, _poly(w, z, _ERF_T)), _poly(w, z, _ERF_U, monic=True))
    large = _signed(w, x, w.op("Sub", _c(w, 1.0), _erfc_held(w, a, 8.0)))  # erf is 1 in double from 6 on
    # NaN fails the comparison and takes the branch that keeps it
    return w.op("Where", w.op("GreaterOrEqual", a, _c(w, 1.0)), large, small, output=output)


def _gelu(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    """Gelu's definition (opset 20), x/2 (1 + erf(x / sqrt 2)), with 1 + erf(z) as erfc(-z) below z = -1 (no
    cancellation: torch's own float64 kernel loses all digits below x = -5.5); with approximate="tanh",
    x/2 (1 + tanh(u)) = x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)."""
    x = node.input[0]
    attrs = {a.name: a for a in node.attribute}
    if "approximate" in attrs and attrs["approximate"].s == b"tanh":
        cube = w.op("Mul", w.op("Mul", x, x), x)
        u2 = w.op("Mul", w.op("Add", x, w.op("Mul", cube, _c(w, 0.044715))), _c(w, 2 * math.sqrt(2 / math.pi)))
        # sigmoid(v) = e / (1 + e) below 0, 1 / (1 + e) above, e = exp(-|v|): onnxruntime's double Sigmoid is 0
        # below -36, where this keeps its digits
        e = w.op("Exp", w.op("Neg", w.op("Abs", u2)))
        sigmoid = w.op("Div", w.op("Where", w.op("Less", u2, _c(w, 0.0)), e, _c(w, 1.0)), w.op("Add", e, _c(w, 1.0)))
        w.op("Mul", x, sigmoid, output=node.output[0])
        return
    z = w.op("Mul", x, _c(w, 1 / math.sqrt(2)))
    # erfc underflows to 0 from 27.3 on: held to 40, exp(-a^2) does
    cdf = w.op("Where", w.op("Less", z, _c(w, -1.0)), _erfc_held(w, w.op("Neg", z), 40.0),
               w.op("Add", _erf_of(w, z), _c(w, 1.0)))
    w.op("Mul", w.op("Mul", x, _c(w, 0.5)), cdf, output=node.output[0])


def _det(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    shape = types.get(node.input[0], (None, None))[1]
    n = shape[-1] if shape else None
    if n is None:
        at = f" at {node_source(node)}" if node_source(node) else ""
        raise BackendError(f"onnxruntime has no double kernel for Det and graphc writes it out only for a matrix "
                           f"size known before the run: {node_label(node.name)}{at} has input "
                           f"{node.input[0]!r} of shape {shape if shape is not None else 'unknown'}; "
                           f"give it a static size or run it in float32")
    if n == 0:  # 1 for each matrix (onnxruntime's ReduceProd over the empty axes returns its input)
        batch = w.op("Slice", w.op("Shape", node.input[0]), w.const([0], np.int64), w.const([-2], np.int64))
        w.op("ConstantOfShape", batch, value=onnx.numpy_helper.from_array(np.ones(1)), output=node.output[0])
        return
    rows = [w.op("Gather", node.input[0], w.const(i, np.int64), axis=-2) for i in range(n)]

    def entry(row: str, k: int) -> str:  # row[..., k:k+1]
        return w.op("Gather", row, w.const([k], np.int64), axis=-1)

    sign, pivots = _c(w, 1.0), []
    for k in range(n):
        for i in range(k + 1, n):  # bring the largest |row[k]| of rows k.. to row k
            swap = w.op("Greater", w.op("Abs", entry(rows[i], k)), w.op("Abs", entry(rows[k], k)))
            rows[k], rows[i] = w.op("Where", swap, rows[i], rows[k]), w.op("Where", swap, rows[k], rows[i])
            sign = w.op("Where", swap, w.op("Neg", sign), sign)
        pivot = entry(rows[k], k)
        pivots.append(pivot)
        # a zero pivot means a zero column below it: nothing to eliminate (and no 0/0)
        safe = w.op("Where", w.op("Equal", pivot, _c(w, 0.0)), _c(w, 1.0), pivot)
        for i in range(k + 1, n):
            rows[i] = w.op("Sub", rows[i], w.op("Mul", w.op("Div", entry(rows[i], k), safe), rows[k]))
    det = sign
    for pivot in pivots:
        det = w.op("Mul", det, pivot)
    if w.opset >= 13:
        w.op("Squeeze", det, w.const([-1], np.int64), output=node.output[0])
    else:
        w.op("Squeeze", det, axes=[-1], output=node.output[0])


def _dropout(w: Writer, node: onnx.NodeProto, types: dict) -> None:
    x, ratio, training = [*node.input, "", ""][:3]
    off = w.constant(training)
    mask = node.output[1] if len(node.output) > 1 and node.output[1] else f"{w.prefix}mask"
    if not training or (off is not None and not off.any()) or not node.output[0]:  # unscaled: kept as it is
        w.nodes.append(node)
        return
    w.op("Dropout", *node.input, output=[f"{w.prefix}scaled_in_float32", mask],
         **{a.name: helper.get_attribute_value(a) for a in node.attribute})
    held = w.op("Sub", _c(w, 1.0), w.op("Cast", ratio, to=onnx.TensorProto.DOUBLE) if ratio else _c(w, 0.5))
    scaled = w.op("Div", w.op("Mul", x, w.op("Cast", mask, to=onnx.TensorProto.DOUBLE)), held)
    if off is not None:
        w.op("Identity", scaled, output=node.output[0])
    else:
        w.op("Where", training, scaled, x, output=node.output[0])


_LOWERINGS = {"Tan": _tan, "Sinh": _sinh, "Cosh": _cosh, "Asin": _asin, "Acos": _acos, "Atan": _atan_node,
              "Asinh": _asinh, "Acosh": _acosh, "Atanh": _atanh, "Erf": _erf, "Det": _det,
              "Gelu": _gelu, "Dropout": _dropout}


# onnxruntime's CUDA provider has double kernels for these (its registrations of Conv, ConvTranspose, the average and
# max pools, InstanceNormalization, PRelu, Resize and Upsample, and in cuda/activation/activations.cc of Elu,
# HardSigmoid, LeakyRelu, Selu, Softplus, Softsign and ThresholdedRelu), where its CPU provider has none; LpPool,
# GlobalLpPool, Celu (float only), HardSwish, Mish, Hardmax, Mean and NonZero have none on either. Its RNN, GRU and
# LSTM (cuDNN) take only some forms: doubles_recurrent.cudnn_runs
_CUDA_DOUBLE_KERNELS = frozenset({"Conv", "ConvTranspose", "AveragePool", "GlobalAveragePool", "GlobalMaxPool",
                                  "Resize", "Upsample", "InstanceNormalization", "PRelu", "Elu", "HardSigmoid",
                                  "LeakyRelu", "Selu", "Softplus", "Softsign", "ThresholdedRelu"})
_RECURRENT = frozenset(doubles_recurrent.LOWERINGS)


def lower_double(model: onnx.ModelProto, device: str = "cpu", types_of: TypesOf = tensor_types) -> onnx.ModelProto:
    """``model`` itself when no graph of it has one of these ops (nor a MeanVarianceNormalization, ``mvn``; nor a
    Conv, ConvTranspose or pool, ``doubles_windows``; nor a Resize, Upsample, InstanceNormalization or PRelu,
    ``doubles_layers``; nor an RNN, GRU or LSTM, ``doubles_recurrent``; nor an activation, Hardmax, Mean or NonZero,
    ``doubles_activations``) in double, else a copy with each written out (the module docstrings). On
    ``device`` "cuda" the ops the CUDA provider runs in double are left to it. ``types_of``: ``lower_written``'s."""
    layers = {**doubles_windows.LOWERINGS, **doubles_layers.LOWERINGS, **doubles_recurrent.LOWERINGS,
              **doubles_activations.LOWERINGS}
    keep = None
    if device == "cuda":
        layers = {op: fn for op, fn in layers.items() if op not in _CUDA_DOUBLE_KERNELS}
        keep = lambda node: node.op_type in _RECURRENT and doubles_recurrent.cudnn_runs(node)
    return lower_doubles(model, {**_LOWERINGS, **mvn.LOWERING, **layers}, keep, types_of)
