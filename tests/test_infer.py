"""passes/infer.py's fast rules never disagree with onnx's per-node inference.

Every op in ``RULES`` runs on random and edge cases (broadcasting with 1s and symbolic dims,
negative and repeated axes, Reshape's 0 and -1, constant and non-constant inputs, opsets with axes
as attributes or inputs). Where a rule answers, onnx must give the same dtype and shape (but for a Reduce
of computed axes with keepdims, where onnx infers nothing and the rule keeps the rank); where a
rule raises ``InferenceError``, onnx must fail too. Conv and pool windows are checked against torch
too (onnx's inference miscounts ceil_mode pools)."""

import numpy as np
import onnx
import onnx_ir as ir
import pytest

from graphc.passes.emit import make_node
from graphc.passes.infer import RULES, InferenceError, infer

F, I64, B = ir.DataType.FLOAT, ir.DataType.INT64, ir.DataType.BOOL
DIMS = [1, 1, 2, 3, 4, "N", "M", None]
CASES_PER_OP = 200


def _shape(rng, rank=None):
    rank = int(rng.integers(0, 5)) if rank is None else rank
    return tuple(DIMS[int(rng.integers(len(DIMS)))] for _ in range(rank))


def _like(rng, shape):
    """A shape that mostly broadcasts with ``shape``: leading dims dropped, dims set to 1, or changed."""
    out = list(shape[int(rng.integers(0, len(shape) + 1)) if rng.random() < 0.3 else 0:])
    for i in range(len(out)):
        r = rng.random()
        out[i] = 1 if r < 0.25 else DIMS[int(rng.integers(len(DIMS)))] if r < 0.35 else out[i]
    return tuple(out)


def _ints(values):
    return (I64, (len(values),), np.asarray(values, np.int64))


def _axes(rng, rank, count=None):
    count = int(rng.integers(0, rank + 1)) if count is None else count
    return [int(a) for a in rng.choice(np.arange(-rank, rank), size=count)] if rank else []


def _axes_input(rng, op, opset, axes, attrs):
    """Axes as a constant input where ``op`` takes them as one at ``opset``, else as the attribute."""
    as_input = opset >= (13 if op in ("ReduceSum", "Squeeze", "Unsqueeze") else 18)
    if as_input:
        return [_ints(axes) if rng.random() < 0.85 else (I64, (len(axes),), None)]
    attrs["axes"] = axes
    return []


def case(op, rng):
    """(inputs as (dtype, shape, constant or None), attributes, opset) for one random case of ``op``."""
    axes_moved = op.startswith("Reduce") or op in ("Squeeze", "Unsqueeze")  # opset 11 has them as attributes
    opset = int(rng.choice([11, 13, 17, 18, 21] if axes_moved else [13, 17, 18, 21]))
    if op in ("LessOrEqual", "GreaterOrEqual"):  # before 16 onnx defines them as functions and infers nothing
        opset = max(opset, 16)
    base = _shape(rng)
    dtype = B if op in ("And", "Or", "Xor", "Not") else I64 if op == "Mod" else F
    if op in ("Add", "Sub", "Mul", "Div", "Pow", "Mod", "And", "Or", "Xor", "Equal", "Less", "LessOrEqual",
              "Greater", "GreaterOrEqual"):
        return [(dtype, _like(rng, base), None), (dtype, _like(rng, base), None)], {}, opset
    if op in ("Max", "Min", "Sum", "Mean"):
        return [(dtype, _like(rng, base), None) for _ in range(int(rng.integers(1, 4)))], {}, opset
    if op == "Where":
        return [(B, _like(rng, base), None), (F, _like(rng, base), None), (F, _like(rng, base), None)], {}, opset
    if op in ("Softmax", "LogSoftmax"):
        return [(F, base, None)], {"axis": int(rng.integers(-len(base) - 1, len(base) + 1))}, opset
    if op in RULES and RULES[op].__name__ == "_same":
        opset = 20 if op == "Gelu" else opset
        if op == "CastLike":
            return [(F, base, None), (ir.DataType.FLOAT16, (), None)], {}, opset
        return [(dtype, base, None)], {}, opset
    if op == "Cast":
        return [(F, base, None)], {"to": int(rng.choice([1, 7, 9, 10]))}, opset
    if op == "Constant":
        arr = rng.random(tuple(int(d) for d in rng.integers(1, 4, int(rng.integers(0, 3))))).astype(np.float32)
        attrs = [{"value": ir.tensor(arr)}, {"value_ints": [1, 2]}, {"value_float": 1.5}, {"value_int": 3}]
        return [], attrs[int(rng.integers(len(attrs)))], opset
    if op == "ConstantOfShape":
        dims = [int(d) for d in rng.integers(0, 4, int(rng.integers(0, 4)))]
        attrs = {"value": ir.tensor(np.ones(1, np.int32))} if rng.random() < 0.5 else {}
        return [_ints(dims) if rng.random() < 0.8 else (I64, (len(dims),), None)], attrs, opset
    if op == "Shape":
        attrs = {"start": int(rng.integers(-5, 5)), "end": int(rng.integers(-5, 5))} if opset >= 15 and \
            rng.random() < 0.6 else {}
        return [(F, base, None)], attrs, opset
    if op == "Size":
        return [(F, base, None)], {}, opset
    if op == "Reshape":
        total = [d for d in base if isinstance(d, int)]
        target = [int(rng.choice([0, -1, 1, 2, 3, 4, 6, 12])) for _ in range(int(rng.integers(0, 4)))]
        if rng.random() < 0.3 and all(isinstance(d, int) for d in base):
            target = [int(np.prod(total)) if total else 1, -1][:int(rng.integers(1, 3))]
        attrs = {"allowzero": 1} if opset >= 14 and rng.random() < 0.2 else {}
        shape_in = _ints(target) if rng.random() < 0.85 else (I64, (len(target),), None)
        return [(F, base, None), shape_in], attrs, opset
    if op == "Transpose":
        perm = [int(p) for p in rng.permutation(len(base))]
        if rng.random() < 0.1 and perm:
            perm[0] = perm[-1]
        return [(F, base, None)], ({"perm": perm} if rng.random() < 0.8 else {}), opset
    if op == "Unsqueeze":
        attrs = {}
        axes = _axes(rng, len(base) + 2, int(rng.integers(1, 3)))
        return [(F, base, None), *_axes_input(rng, op, opset, axes, attrs)], attrs, opset
    if op == "Squeeze":
        ones = [i - len(base) if rng.random() < 0.5 else i for i, d in enumerate(base) if d == 1 or d == "N"]
        axes = ones[:int(rng.integers(0, len(ones) + 1))]
        if rng.random() < 0.2:
            return [(F, base, None)], {}, opset
        attrs = {}
        return [(F, base, None), *_axes_input(rng, op, opset, axes, attrs)], attrs, opset
    if op.startswith("Reduce"):
        attrs = {"keepdims": int(rng.integers(0, 2))}
        if rng.random() < 0.2:
            return [(F, base, None)], attrs, opset
        if rng.random() < 0.2 and opset >= (13 if op == "ReduceSum" else 18):
            attrs["noop_with_empty_axes"] = 1
        axes = _axes(rng, len(base))
        return [(F, base, None), *_axes_input(rng, op, opset, axes, attrs)], attrs, opset
    if op == "Concat":
        rank = max(len(base), 1)
        axis = int(rng.integers(-rank, rank))
        shapes = [tuple(DIMS[int(rng.integers(len(DIMS)))] if j == axis % rank or rng.random() < 0.15 else d
                        for j, d in enumerate(_shape(rng, rank) if not base else base))
                  for _ in range(int(rng.integers(1, 4)))]
        return [(F, s, None) for s in shapes], {"axis": axis}, opset
    if op == "Slice":
        axes = _axes(rng, len(base), int(rng.integers(0, len(base) + 1)))
        ends = [int(rng.choice([-5, -1, 0, 2, 3, 9, 2**62])) for _ in axes]
        args = [_ints([int(rng.integers(-5, 5)) for _ in axes]), _ints(ends), _ints(axes),
                _ints([int(rng.choice([-2, -1, 1, 2, 3])) for _ in axes])]
        if rng.random() < 0.1:
            args[1] = (I64, (len(axes),), None)
        return [(F, base, None), *args[:int(rng.integers(2, 5))]], {}, opset
    if op == "Pad":
        axes = _axes(rng, len(base), int(rng.integers(0, len(base) + 1))) if opset >= 18 and rng.random() < 0.5 \
            else None
        count = len(base) if axes is None else len(axes)
        pads = _ints([int(rng.choice([-1, 0, 0, 1, 2, 3])) for _ in range(2 * count)])
        if rng.random() < 0.1:
            pads = (I64, (2 * count,), None)
        return [(F, base, None), pads, *([] if axes is None else [(F, (), np.zeros((), np.float32)), _ints(axes)])], \
            {}, opset
    if op == "MatMul":
        a = _shape(rng, int(rng.integers(1, 5)))
        b = list(_like(rng, a[:-2])) + [a[-1] if rng.random() < 0.8 else DIMS[int(rng.integers(len(DIMS)))],
                                        DIMS[int(rng.integers(len(DIMS)))]]
        b = b[-1:] if rng.random() < 0.15 else b
        return [(F, a, None), (F, tuple(b), None)], {}, opset
    if op == "Gemm":
        m, k, n = (DIMS[int(i)] for i in rng.integers(len(DIMS), size=3))
        k2 = k if rng.random() < 0.8 else DIMS[int(rng.integers(len(DIMS)))]
        ta, tb = int(rng.integers(0, 2)), int(rng.integers(0, 2))
        a, b = (k, m) if ta else (m, k), (n, k2) if tb else (k2, n)
        inputs = [(F, a, None), (F, b, None)] + ([(F, _like(rng, (m, n)), None)] if rng.random() < 0.5 else [])
        return inputs, {"transA": ta, "transB": tb}, opset
    if op == "Gather":
        rank = max(len(base), 1)
        return [(F, base or (3,), None), (I64, _shape(rng), None)], \
            {"axis": int(rng.integers(-rank - 1, rank + 1))}, opset
    if op == "Expand":
        target = [int(rng.choice([1, 2, 3, 4])) for _ in range(int(rng.integers(0, 5)))]
        return [(F, base, None), _ints(target) if rng.random() < 0.85 else (I64, (len(target),), None)], {}, opset
    if op == "Einsum":  # each letter one dim in every operand (where they differ, onnx's inference is wrong)
        dims = {c: DIMS[int(rng.integers(len(DIMS)))] for c in "ijkl"}
        terms = ["".join(rng.permutation(list("ijkl"))[:int(rng.integers(1, 4))]) for _ in range(int(rng.integers(1, 4)))]
        used = sorted(set("".join(terms)))
        out = "".join(rng.permutation(used)[:int(rng.integers(0, len(used) + 1))]) if used else ""
        equation = ",".join(terms) + ("->" + out if rng.random() < 0.7 else "")
        return [(F, tuple(dims[c] for c in t), None) for t in terms], {"equation": equation}, opset
    if op in WINDOWED:
        return _window_case(op, rng, opset)
    raise AssertionError(f"no cases for {op}")


WINDOWED = ("Conv", "MaxPool", "AveragePool", "LpPool")


def _window_case(op, rng, opset):
    """A Conv or pool over 1 to 3 spatial dims, floor mode (onnx keeps a last ceil_mode window
    that starts in the padding: test_pool_shapes_match_torch checks those), every window inside
    the padded input where a size is fixed (with none the rule refuses and onnx answers 0)."""
    nd = int(rng.integers(1, 4))
    sizes = [DIMS[int(rng.integers(len(DIMS)))] for _ in range(nd)]
    strides = [int(s) for s in rng.integers(1, 4, nd)]
    dilations = [int(d) for d in rng.integers(1, 3, nd)] if op == "Conv" or opset >= 19 or \
        (op != "AveragePool" and opset >= 18) else [1] * nd
    pads = [int(p) for p in rng.integers(0, 3, 2 * nd)]
    kernel = [int(k) for k in rng.integers(1, 4, nd)]
    kernel = [min(k, (s + pads[i] + pads[nd + i] - 1) // d + 1) if isinstance(s, int) else k
              for i, (k, s, d) in enumerate(zip(kernel, sizes, dilations))]
    attrs = {"kernel_shape": kernel, "strides": strides, "pads": pads}
    if dilations != [1] * nd:
        attrs["dilations"] = dilations
    if op != "Conv":
        x = (DIMS[int(rng.integers(len(DIMS)))], DIMS[int(rng.integers(len(DIMS)))], *sizes)
        return [(F, x, None)], attrs, opset
    group = int(rng.choice([1, 2]))
    x = (DIMS[int(rng.integers(len(DIMS)))], 2 * group, *sizes)
    out = DIMS[int(rng.integers(len(DIMS)))] if rng.random() < 0.3 else 2 * group
    if rng.random() < 0.5:
        del attrs["kernel_shape"]
    bias = [(F, (out,), None)] if rng.random() < 0.5 else []
    return [(F, x, None), (F, (out, 2, *kernel), None), *bias], {**attrs, "group": group}, opset


def onnx_result(node, inputs, opset):
    types, data = {}, {}
    for v, (dtype, shape, arr) in zip(node.inputs, inputs):
        types[v.name] = onnx.helper.make_tensor_type_proto(dtype, list(shape))
        if arr is not None:
            data[v.name] = onnx.numpy_helper.from_array(arr, v.name)
    schema = onnx.defs.get_schema(node.op_type, opset, "")
    result = onnx.shape_inference.infer_node_outputs(schema, ir.serde.serialize_node(node), types, data,
                                                     opset_imports=[onnx.helper.make_opsetid("", opset)])
    tt = result["y"].tensor_type
    shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim) \
        if tt.HasField("shape") else None
    return ir.DataType(tt.elem_type), shape


@pytest.mark.parametrize("op", sorted(RULES))
def test_fast_rules_agree_with_onnx(op):
    rng = np.random.default_rng(sum(map(ord, op)))
    answered = 0
    for _ in range(CASES_PER_OP):
        inputs, attrs, opset = case(op, rng)
        values = [ir.Value(name=f"x{i}", type=ir.TensorType(dtype), shape=ir.Shape(list(shape)))
                  for i, (dtype, shape, _) in enumerate(inputs)]
        node = make_node(op, values, attrs, outputs=[ir.Value(name="y")], name="n")
        arrays = {id(v): arr for v, (_, _, arr) in zip(values, inputs) if arr is not None}
        what = f"{op} opset {opset} inputs {[(d.name, s) for d, s, _ in inputs]} attrs {attrs}"
        try:
            ((dtype, shape),) = infer(node, opset, lambda v: arrays.get(id(v)))
        except InferenceError:
            with pytest.raises(Exception):
                onnx_result(node, inputs, opset)
            continue
        try:
            want = onnx_result(node, inputs, opset)
        except Exception as exc:
            assert shape is None, f"{what}: rule gave {shape}, onnx failed: {exc}"
            continue
        assert dtype == want[0], what
        if shape is not None and want[1] is None and op.startswith("Reduce"):
            # computed axes, keepdims: onnx infers nothing; the rank is the input's, each dim kept or 1
            x = inputs[0][1]
            assert inputs[1][2] is None and attrs.get("keepdims", 1), what
            assert len(shape) == len(x) and all(d in (e, 1, None) for d, e in zip(shape, x)), what
            continue
        if shape is not None:
            answered += 1
            assert shape == want[1], f"{what}: rule {shape}, onnx {want[1]}"
    assert answered >= CASES_PER_OP // 4, f"{op}: the rule answered only {answered} cases"


def test_an_output_typed_like_an_untyped_input_stays_unknown():
    """CastLike's output takes its target's dtype: with the target untyped it is unknown, not the
    cast input's (a bool mask cast like an untyped value was taken for a bool, and a ReduceSum of it
    refused); Add of an untyped and a float operand is float."""
    mask, target = ir.Value(name="m", type=ir.TensorType(B), shape=ir.Shape(["N"])), ir.Value(name="t")
    ((dtype, shape),) = infer(make_node("CastLike", [mask, target], {}, outputs=[ir.Value(name="y")], name="n"), 21)
    assert dtype is None and shape == ("N",)
    x = ir.Value(name="x", type=ir.TensorType(F), shape=ir.Shape([3]))
    ((dtype, _),) = infer(make_node("Add", [target, x], {}, outputs=[ir.Value(name="y")], name="n"), 21)
    assert dtype == F


def test_pool_shapes_match_torch():
    """MaxPool/AveragePool/Conv window counts vs torch over kernel, stride, padding, dilation and
    ceil_mode (a last ceil_mode window that would start in the padding is dropped: AveragePool over
    7 wide, kernel 4, stride 3, pads 2 gives 3, onnx's inference 4); where torch finds the output
    too small, the rule refuses."""
    torch = pytest.importorskip("torch")
    import itertools

    checked = 0
    for op, size, k, s, p, d, ceil in itertools.product(("MaxPool", "AveragePool", "Conv"), range(1, 9),
                                                        range(1, 5), range(1, 4), range(3), (1, 2), (0, 1)):
        if (op == "AveragePool" and d > 1) or (op == "Conv" and ceil) or (op != "Conv" and 2 * p > k):
            continue  # torch: no dilated avg_pool or ceil_mode conv; pool pads at most half the kernel
        x = ir.Value(name="x", type=ir.TensorType(F), shape=ir.Shape([1, 2, size, size + 1]))
        attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4, "dilations": [d, d]}
        inputs = [x]
        if op == "Conv":
            inputs.append(ir.Value(name="w", type=ir.TensorType(F), shape=ir.Shape([3, 2, k, k])))
        else:
            attrs["ceil_mode"] = ceil
        node = make_node(op, inputs, attrs, outputs=[ir.Value(name="y")], name="n")
        t = torch.zeros(1, 2, size, size + 1)
        try:
            want = tuple((torch.nn.functional.conv2d(t, torch.zeros(3, 2, k, k), None, s, p, d) if op == "Conv"
                          else torch.nn.functional.max_pool2d(t, k, s, p, d, bool(ceil)) if op == "MaxPool"
                          else torch.nn.functional.avg_pool2d(t, k, s, p, bool(ceil))).shape)
        except RuntimeError as exc:
            assert "too small" in str(exc) or "greater than actual input size" in str(exc)
            with pytest.raises(InferenceError, match="output size is too small"):
                infer(node, 21, fallback=True)
            continue
        ((_, shape),) = infer(node, 21, fallback=True)
        assert shape == want, f"{op} size {size} kernel {k} stride {s} pad {p} dilation {d} ceil {ceil}"
        checked += 1
    assert checked > 1000



@pytest.mark.parametrize("equation, shapes, want", [
    ("bij,bjk->bki", [(1, 2, 3), (2, 3, 2)], (2, 2, 2)), ("ij,kj->ik", [(2, 1), (3, 4)], (2, 3)),
    ("ij,jk", [(2, 1), (4, 3)], (2, 3)), ("ij,ij->ij", [("N", 1), ("N", 3)], ("N", 3))])
def test_einsum_broadcasts_labelled_dims_as_numpy(equation, shapes, want):
    """A labelled dim of 1 broadcasts against a larger one (numpy, torch and onnxruntime run it;
    onnx 1.23's inference keeps the first operand's dim): the rule gives numpy's shape."""
    values = [ir.Value(name=f"x{i}", type=ir.TensorType(F), shape=ir.Shape(list(s))) for i, s in enumerate(shapes)]
    node = make_node("Einsum", values, {"equation": equation}, outputs=[ir.Value(name="y")], name="n")
    ((_, shape),) = infer(node, 21)
    assert shape == want
    arrays = [np.zeros([d if isinstance(d, int) else 5 for d in s]) for s in shapes]
    assert np.einsum(equation, *arrays).shape == tuple(5 if isinstance(d, str) else d for d in want)
