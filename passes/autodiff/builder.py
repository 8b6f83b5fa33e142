"""GradBuilder: what gradient rules use to append ``ai.onnx`` nodes to the graph being differentiated.

An ``Emitter`` (naming, shared constants, opset-aware ``reduce``/``squeeze``/``unsqueeze``) that
also emits ``split`` by opset, stamps each new node with the forward node's ``graphc.source``,
and gives the driver ``sum_to``, which undoes broadcasting statically or with ``Shape``.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping, Sequence

import numpy as np
import onnx_ir as ir

from graphc.errors import AutodiffError
from graphc.passes.emit import SOURCE_KEY, Emitter
from graphc.passes.evaluate import folded_array
from graphc.passes.values import Dim, StaticShape, attr, const_array, node_attrs, static_shape

__all__ = ["SOURCE_KEY", "FLOAT_TYPES", "GradBuilder", "attr", "const_array", "folded_array", "is_float",
           "is_static", "node_attrs", "rows_factors", "same_dim", "static_shape",
           "take_outputs"]

FLOAT_TYPES = frozenset({ir.DataType.FLOAT, ir.DataType.DOUBLE, ir.DataType.FLOAT16, ir.DataType.BFLOAT16})


def is_static(shape: StaticShape | None) -> bool:
    return shape is not None and all(isinstance(d, int) for d in shape)


def _lone_expand(value: ir.Value) -> bool:
    """``value`` is the output of an ai.onnx ``Expand`` that nothing reads yet."""
    node = value.producer()
    return (node is not None and node.op_type == "Expand" and node.domain in ("", "ai.onnx")
            and not value.uses() and not value.is_graph_output())


def rows_factors(node: ir.Node) -> tuple[ir.Value, ir.Value] | None:
    """(A, B) when ``node`` is ``Gemm(A, B, transA=1)`` (no C, no transB, alpha 1) or
    ``MatMul(Transpose(A, perm=[1, 0]), B)``: ``A^T @ B``, a sum over the rows of A [rows, k] and
    B [rows, m] (MatMul's and Gemm's rules for a weight); else None. Reads op types and attributes
    only: callers check the domain, shapes and where the values live."""
    if node.op_type == "Gemm" and len(node.inputs) == 2 and attr(node, "transA", 0) == 1 \
            and not attr(node, "transB", 0) and attr(node, "alpha", 1.0) == 1.0:
        return node.inputs[0], node.inputs[1]
    swapped = node.inputs[0].producer() if node.op_type == "MatMul" else None
    if swapped is not None and swapped.op_type == "Transpose" and list(attr(swapped, "perm", [])) == [1, 0]:
        return swapped.inputs[0], node.inputs[1]
    return None


def _rows_product(value: ir.Value) -> tuple[ir.Value, ir.Value] | None:
    """``rows_factors`` of the ai.onnx node computing ``value`` (a matrix) when nothing reads it yet;
    else None."""
    node, shape = value.producer(), static_shape(value)
    if node is None or node.domain not in ("", "ai.onnx") or value.uses() or value.is_graph_output() \
            or shape is None or len(shape) != 2:
        return None
    return rows_factors(node)


def _leading_sum_rows(value: ir.Value) -> ir.Value | None:
    """X when ``value`` is ``sum_leading``'s sum of a matrix X [R, F] over its rows (ones [R] @ X, or
    ReduceSum over axis 0) and nothing reads it yet; else None."""
    node = value.producer()
    if node is None or node.domain not in ("", "ai.onnx") or value.uses() or value.is_graph_output():
        return None
    rows = node.inputs[-1] if node.op_type == "MatMul" else node.inputs[0] if node.op_type == "ReduceSum" else None
    shape = static_shape(rows) if rows is not None else None
    if shape is None or len(shape) != 2 or not isinstance(shape[1], int):
        return None
    if node.op_type == "MatMul":
        ones = node.inputs[0].producer()
        fill = ones.attributes.get("value") if ones is not None and ones.op_type == "ConstantOfShape" else None
        return rows if fill is not None and fill.value.numpy().tolist() == [1.0] else None
    axes = attr(node, "axes") if len(node.inputs) < 2 else const_array(node.inputs[1])
    return rows if axes is not None and list(np.ravel(axes)) == [0] and attr(node, "keepdims", 1) == 0 else None


def _stacked_already(values: Sequence[ir.Value]) -> ir.Value | None:
    """An ai.onnx ``Concat`` along axis 0 of ``values`` in any order, already in their graph."""
    for node, _ in values[0].uses() if values else ():
        if node.op_type == "Concat" and node.domain in ("", "ai.onnx") and attr(node, "axis", 0) == 0 \
                and node.graph is not None and sorted(map(id, node.inputs)) == sorted(map(id, values)):
            return node.outputs[0]
    return None


def _remove_dead(node: ir.Node) -> None:
    """Remove ``node`` and, up its inputs, the nodes (but shared Constants) that only it read."""
    producers = {v.producer() for v in node.inputs if v is not None}
    node.graph.remove(node, safe=True)
    for p in producers:
        if p is not None and p.op_type != "Constant" and p.graph is not None \
                and not any(o.uses() or o.is_graph_output() for o in p.outputs):
            _remove_dead(p)


def take_outputs(olds: Sequence[ir.Value], news: Sequence[ir.Value]) -> None:
    """Each of ``news`` takes its ``olds``' place (pairwise, as many as the shorter has): its type,
    shape, readers, graph-output slots and name. The caller removes the old node (with_outputs
    inserts the new one after this, so that the graph names only the outputs left unnamed)."""
    for old, new in zip(olds, news):
        name, old.name = old.name, None
        new.type, new.shape = old.type, old.shape
        old.replace_all_uses_with(new, replace_graph_outputs=True)
        new.name = name


def same_dim(a: Dim, b: Dim) -> bool:
    """True when two dims are known to be equal (same int, or the same symbol)."""
    return a is not None and a == b


def is_float(value: ir.Value) -> bool:
    """Floating-point (or of unknown type, which we treat as differentiable)."""
    return value.dtype is None or value.dtype in FLOAT_TYPES


class GradBuilder(Emitter):
    """Values are named ``<forward node>/grad/<op>_<n>`` while ``scope`` is set to that node.

    Rules read dtypes off the primal values (``core`` types each gradient like its primal once
    the rule returns); the dtypes it guesses for intermediates let ``scalar`` emit a typed
    constant instead of CastLike, which opsets before 15 lack. ``device`` ("cpu" or "cuda"):
    whose kernels the rules choose their lowerings for, where the two differ; ``nchwc``: on the
    CPU, the channel block of onnxruntime's NCHWc kernels, which the ort-cpu backend runs Convs
    with fed weights on (``graphc.backends.nchwc``), 0 where there are none."""

    def __init__(self, graph: ir.Graph, opset: int, names=None, device: str = "cpu", nchwc: int = 0):
        super().__init__(graph, opset, scope="grad", names=names)
        self.device = device
        self.nchwc = nchwc
        self.needed: set[ir.Value] | None = None  # values whose gradient the walk wants
        # the model's functions, where a ``gc.autograd.Function``'s backward is (``core.backprop``), for
        # the walks of the bodies the rules differentiate too
        self.functions: Mapping[ir.OperatorIdentifier, ir.Function] | None = None
        # gradients a rule returned in a broadcast shape other than the output's (see registry)
        self.broadcast_shapes: dict[ir.Value, StaticShape | None] = {}
        # Expands ``_unexpanded`` read around, each once in the order first read around (a dict as an
        # ordered set: one Expand can be read around again); removed once the walk ends (``drop_unread_expands``)
        self.unread_expands: dict[ir.Node, None] = {}

    def broadcast_from(self, dx: ir.Value, shape: StaticShape | None) -> ir.Value:
        """Mark ``dx`` as a gradient in the broadcast shape ``shape`` (None: known at run time
        only); the driver sums it down to its input's shape. Returns ``dx``."""
        self.broadcast_shapes[dx] = shape
        return dx

    def wants(self, value: ir.Value | None) -> bool:
        """Whether a rule should compute the gradient of ``value`` (skip frozen/int inputs)."""
        if value is None or not is_float(value):
            return False
        return self.needed is None or value in self.needed

    def with_outputs(self, node: ir.Node, count: int) -> ir.Node:
        """``node`` with at least ``count`` outputs (MaxPool Indices, Dropout mask), all named.

        When the node lacks them, it is replaced in the graph by a copy that has them.
        """
        if len(node.outputs) < count:
            new = ir.Node(node.domain, node.op_type, list(node.inputs), list(node.attributes.values()),
                          num_outputs=count, name=node.name, version=node.version,
                          metadata_props=dict(node.metadata_props))
            take_outputs(node.outputs, new.outputs)
            node.graph.insert_before(node, new)
            node.graph.remove(node, safe=True)
            node = new
        for out in node.outputs:
            self.name_value(out)
        return node

    def subgraph_builder(self, graph: ir.Graph) -> GradBuilder:
        """A builder appending to ``graph`` (an If branch) whose names cannot clash with ours."""
        child = GradBuilder(graph, self.opset, names=self._names, device=self.device, nchwc=self.nchwc)
        child.scope, child.functions = self.scope, self.functions
        return child

    def require_opset(self, opset: int, what: str) -> None:
        if self.opset < opset:
            raise AutodiffError(f"gradient of node {self.scope.removesuffix('/grad')!r} needs {what}, "
                                f"which ONNX has from opset {opset}; the model has opset {self.opset} "
                                "(gc.grad and gc.training.generate upgrade older models to opset 17)")

    # -- shapes ------------------------------------------------------------------------------
    def rank(self, value: ir.Value) -> int:
        shape = static_shape(value)
        if shape is None:
            raise AutodiffError(
                f"gradient of node {self.scope!r} needs the rank of {value.name!r}, which is "
                "unknown; run shape inference on the model first")
        return len(shape)

    def shape_of(self, value: ir.Value) -> ir.Value:
        """The shape as an int64 1-D value: a constant when static, else a ``Shape`` node."""
        shape = static_shape(value)
        if is_static(shape):
            return self.ints(shape)
        return self.op("Shape", value)

    def full(self, shape: ir.Value, fill: float, like: ir.Value) -> ir.Value:
        """A tensor of ``shape`` (an int64 1-D value) filled with ``fill`` in ``like``'s dtype."""
        dtype = (like.dtype or ir.DataType.FLOAT).numpy()
        return self.op("ConstantOfShape", shape, value=ir.tensor(np.full(1, fill, dtype=dtype)))

    def zeros_like(self, value: ir.Value) -> ir.Value:
        if isinstance(value.type, ir.SequenceType):
            return self.seq_map(lambda sub, x: sub.zeros_like(x), value)
        zeros = self.full(self.shape_of(value), 0.0, value)
        if zeros.shape is None and value.shape is not None:  # ConstantOfShape(Shape(value)): value's, symbols too
            zeros.shape = ir.Shape(list(value.shape))
        return zeros

    def flat_zeros_like(self, value: ir.Value, like: ir.Value) -> ir.Value:
        """Zeros with as many elements as ``value`` has, 1-D, in ``like``'s dtype (its size a constant
        when static: onnxruntime does not fold Size, which keeps ``value`` alive until it runs)."""
        shape = static_shape(value)
        size = self.ints([math.prod(shape)]) if is_static(shape) else self.op("Reshape", self.op("Size", value), self.ints([1]))
        return self.full(size, 0.0, like)

    def reshape_like(self, dy: ir.Value, like: ir.Value) -> ir.Value:
        return self.reshape_to(dy, self.shape_of(like), static_shape(like))

    def reshape_to(self, x: ir.Value, shape: ir.Value, known: StaticShape | None = None) -> ir.Value:
        """``Reshape(x, shape)`` where ``shape`` is an actual shape (no -1), ``known`` its static
        form if any. A 0 in it is a zero-size dim, not Reshape's "copy this dim" (``allowzero``,
        opset >= 14); the attribute is left out where no dim can be 0."""
        if self.opset >= 14 and not (is_static(known) and 0 not in known):
            return self.op("Reshape", x, shape, allowzero=1)
        return self.op("Reshape", x, shape)

    # -- opset-dependent forms ---------------------------------------------------------------
    def split(self, x: ir.Value, sizes: Sequence[int] | ir.Value, axis: int, count: int) -> tuple[ir.Value, ...]:
        """``x`` split along ``axis`` into ``count`` parts of ``sizes`` (ints, or an int64 Value)."""
        if not isinstance(sizes, ir.Value):
            return super().split(x, sizes, axis, count)
        self.require_opset(13, "Split with run-time sizes")
        parts = self.op("Split", x, sizes, axis=axis, num_outputs=count)
        return parts if count > 1 else (parts,)

    # -- arithmetic shorthands -----------------------------------------------------------------
    def add(self, a, b): return self.op("Add", a, b)
    def sub(self, a, b): return self.op("Sub", a, b)
    def mul(self, a, b): return self.op("Mul", a, b)
    def div(self, a, b): return self.op("Div", a, b)
    def neg(self, a): return self.op("Neg", a)

    def cast_like(self, x: ir.Value, like: ir.Value) -> ir.Value:
        if like.dtype is not None:
            return self.op("Cast", x, to=int(like.dtype))
        return self.op("CastLike", x, like)

    def transpose(self, x: ir.Value, perm: Sequence[int]) -> ir.Value:
        if list(perm) == list(range(len(perm))):
            return x
        return self.op("Transpose", x, perm=[int(p) for p in perm])

    def swap_last(self, x: ir.Value, rank: int | None = None) -> ir.Value:
        """``x`` with its last two axes swapped (``rank``: x's, where its shape is not inferred yet)."""
        perm = list(range(self.rank(x) if rank is None else rank))
        perm[-2], perm[-1] = perm[-1], perm[-2]
        return self.transpose(x, perm)

    def sum_values(self, values: Sequence[ir.Value]) -> ir.Value:
        """The sum of ``values``: one variadic ``Sum`` past two (a weight read by every step of an
        unrolled LSTM: one kernel over 32 gradients, not 31 Adds)."""
        if len(values) == 1:
            return values[0]
        if isinstance(values[0].type, ir.SequenceType):  # a sequence read twice: element by element
            return self.seq_map(lambda sub, *xs: sub.sum_values(xs), *values)
        values = self._unexpanded(values)
        products = [_rows_product(v) for v in values]
        if all(products):
            return self.stacked_product(values, products)
        rows = [_leading_sum_rows(v) for v in values]
        stacked = _stacked_already(rows) if all(x is not None for x in rows) else None
        if stacked is not None:  # stacking them anew, a copy, is slower for large terms
            return self.stacked_leading_sum(values, stacked, rows)
        return self.add(*values) if len(values) == 2 else self.op("Sum", *values)

    def stacked_product(self, values: Sequence[ir.Value], products: list[tuple[ir.Value, ir.Value]]) -> ir.Value:
        """The sum of ``values``, each ``A_i^T @ B_i`` (``products``), as one Gemm over the stacked
        rows, ``Concat(A_i)^T @ Concat(B_i)``; the per-term Gemms are removed. The terms are a
        weight's gradients from each MatMul that reads it: the recurrence weight of an unrolled
        RNN, a term per step (as reverse mode stacks a Scan's steps). ``bench_recurrent.py --model
        lm`` (batch 16, AdamW; 1-thread CPU ms per step, ort-cpu, interleaved; each term [256, 1024]
        from 16 rows): LSTM 256 T=64 per-step Gemms + Sum 45.1, the stacked steps as one batched
        MatMul + ReduceSum 43.7, Concat + Gemm 39.0 (T=16 13.7 / 15.8 / 12.2, T=32 24.1 / 23.8 /
        20.7); GRU T=64 39.5 / 38.1 / 33.3. An unrolled RNN's or LSTM's gate gradients, which the
        input projection's gradient stacks too (in time order, these in reverse), read off that one
        Concat instead (the terms reordered): LSTM 256 T=4 7.31 vs 7.30 and 7.25 vs 7.31, T=16 13.66
        vs 13.52 and 14.83 vs 14.80, RNN T=8 4.37 vs 4.41 and 4.88 vs 4.91 ms: even, so two Concats."""
        for v in values:
            node = v.producer()
            swapped = node.inputs[0].producer() if node.op_type == "MatMul" else None
            node.graph.remove(node, safe=True)
            if swapped is not None and not swapped.outputs[0].uses():
                swapped.graph.remove(swapped, safe=True)
        a, b = (self.op("Concat", *side, axis=0) for side in zip(*products))
        return self.op("Gemm", a, b, transA=1)

    def stacked_leading_sum(self, values: Sequence[ir.Value], stacked: ir.Value, rows: list[ir.Value]) -> ir.Value:
        """The sum of ``values``, each ``sum_leading``'s sum of the matrix ``rows[i]``, as one sum of
        ``stacked``, a Concat of the rows made already; the per-term sums go. The terms are a bias's
        gradients from each Gemm that adds it, stacked for its weight's gradient (``stacked_product``):
        a GRU's recurrence bias under ``linear_before_reset``, read by every unrolled step. GRU 256 LM
        (``bench_recurrent.py --model lm``, batch 16, AdamW, 1-thread CPU ms, interleaved), a GEMV
        per step and their Sum vs this: T=4 6.21 / 6.10, 6.12 / 6.09 (474 -> 458 train_step nodes),
        unrolled T=16 10.86 / 10.71, 11.89 / 11.83 (870 -> 794). Stacked anew (no such Concat) it
        copies the terms: 2 x [4096, 256] 131 vs 262 us, though 64 x [16, 256] 104 vs 85."""
        for v in values:
            _remove_dead(v.producer())
        shapes = [static_shape(x) for x in rows]
        total = sum(s[0] for s in shapes) if all(isinstance(s[0], int) for s in shapes) else None
        return self.sum_leading(stacked, [total, shapes[0][1]], 1)

    def mul_grad(self, dy: ir.Value, other: ir.Value) -> ir.Value:
        """``dy * other`` for a Mul's one wanted operand: a ``dy`` that a rule broadcast by
        ``Expand`` (a sum's) is read unexpanded when ``other`` has the full shape. Cross-entropy
        over a 2,048-token vocabulary at batch 32 x 128 (GPT): one 32 MB write and buffer fewer
        at the backward's start, where its memory peaks."""
        return self.mul(*self._unexpanded([dy, other]))

    def _unexpanded(self, values: Sequence[ir.Value]) -> list[ir.Value]:
        """``values`` with each gradient a rule broadcast by ``Expand`` (a mean's or a global
        pool's, unused so far) replaced by the Expand's input when another value has the full
        shape: the sum broadcasts it anyway, and the Expand's full-size write is saved. In
        EfficientNet-B0's squeeze-excite blocks (x read by the pool and the gating Mul) the
        Expand took 1.2-2.1 ms a block at batch 32 (onnxruntime CPU, 2 threads), as long as the
        Add it feeds."""
        out = list(values)
        full = next((v for v in values if not _lone_expand(v)), None)
        shape = static_shape(full) if full is not None else None
        if shape is None or any(d is None for d in shape):
            return out
        for i, v in enumerate(values):
            if not _lone_expand(v) or v.producer().inputs[1] is None:
                continue
            expand = v.producer()
            target = expand.inputs[1]
            made_by = target.producer()
            fixed = const_array(target)
            if ((fixed is not None and is_static(shape) and [int(d) for d in fixed] == list(shape))
                    or (made_by is not None and made_by.op_type == "Shape" and not made_by.attributes
                        and static_shape(made_by.inputs[0]) == shape)):
                out[i] = expand.inputs[0]
                self.unread_expands[expand] = None
        return out

    def drop_unread_expands(self, results: Collection[ir.Value] = ()) -> None:
        """Remove the Expands ``_unexpanded`` read around that nothing came to read and that are not
        among ``results`` (the walk's gradients, read by its caller next). Not at once: a rule may hand
        one gradient to several inputs (an Add's ``dy`` to both ``a*x`` and ``a*y``, or to a param
        that is also read elsewhere and to one that is not), so the Expand can still have a reader to
        come when the first reads around it."""
        for expand in self.unread_expands:
            if expand.graph is not None and not any(o.uses() or o.is_graph_output() or o in results
                                                    for o in expand.outputs):
                expand.graph.remove(expand, safe=True)
        self.unread_expands.clear()

    # -- sequences -----------------------------------------------------------------------------
    def seq_map(self, fn, *seqs: ir.Value, dtype: ir.DataType | None = None) -> ir.Value:
        """``SequenceMap`` over the equally long ``seqs``: element ``i`` of the result is
        ``fn(sub, x_i, y_i, ...)`` built by ``sub`` in the body; its dtype ``dtype``, by default
        the elements' of ``seqs[0]``."""
        self.require_opset(17, "SequenceMap (a gradient through a sequence whose length is known only at run time)")
        body = ir.Graph([], [], nodes=[], name=self.fresh("sequence_map_body"))
        sub = self.subgraph_builder(body)
        for seq in seqs:
            body.inputs.append(ir.Value(name=self.fresh("element"), type=ir.TensorType(self.element_dtype(seq))))
        out = sub.op("Identity", fn(sub, *body.inputs))
        dtype = self.element_dtype(seqs[0]) if dtype is None else dtype
        out.type = ir.TensorType(dtype)
        body.outputs.append(out)
        return self.op("SequenceMap", *seqs, body=body, dtype=dtype)

    def element_dtype(self, seq: ir.Value) -> ir.DataType:
        """The dtype of the sequence ``seq``'s elements; an AutodiffError where it is not recorded."""
        elem = seq.type.elem_type if isinstance(seq.type, ir.SequenceType) else None
        if elem is None or elem.dtype in (None, ir.DataType.UNDEFINED):
            raise AutodiffError(f"gradient of node {self.scope.removesuffix('/grad')!r} needs the element type of the "
                                 f"sequence {seq.name!r}, which is not recorded; run shape inference on the model first")
        return elem.dtype

    # -- undoing broadcasting ----------------------------------------------------------------
    def sum_to(self, dx: ir.Value, dx_shape: StaticShape | None, target: ir.Value,
               target_shape: StaticShape | None = None) -> ir.Value:
        """Sum ``dx`` (a gradient of broadcast shape ``dx_shape``) down to ``target``'s shape.

        Static when the axes to reduce are known from the shapes (a target dim of 1 is always
        safe to sum over); otherwise the axes come from comparing ``Shape`` values at run time.
        """
        ts = static_shape(target) if target_shape is None else target_shape
        if dx_shape is not None and ts is not None:
            axes = self._broadcast_axes(dx_shape, ts)
            if axes is not None:
                lead = len(dx_shape) - len(ts)
                if not axes:
                    return dx
                if axes == list(range(lead)):
                    return self.sum_leading(dx, dx_shape, lead)
                summed = self.reduce("ReduceSum", dx, axes, keepdims=True)
                if lead == 0:
                    return summed
                return self.reshape_to(summed, self.ints(ts) if is_static(ts) else self.op("Shape", target), ts)
        return self._sum_to_dynamic(dx, target)

    def sum_leading(self, dx: ir.Value, dx_shape: StaticShape, lead: int) -> ir.Value:
        """``dx`` summed over its first ``lead`` axes (a bias's gradient). On the CPU a float32 one
        whose other dims are static is a GEMV, ones [R] x dx as [R, F]: onnxruntime's ReduceSum
        over leading axes runs at half the speed (``bench_lowerings.py --only leading_sum``, ms,
        ReduceSum vs GEMV, 2 threads: [32, 128, 1024] 1.65 vs 0.67, [32, 65, 192] 0.23 vs 0.12,
        [2, 128, 256] 0.08 vs 0.02, [4096, 8] 0.13 vs 0.02; 1 thread: 1.96 vs 1.23, 0.11 vs 0.08,
        0.08 vs 0.02, 0.03 vs 0.01)."""
        rest = dx_shape[lead:]
        if self.device != "cpu" or dx.dtype != ir.DataType.FLOAT or not lead or not is_static(rest):
            return self.reduce("ReduceSum", dx, list(range(lead)), keepdims=False)
        width = math.prod(rest)
        if is_static(dx_shape[:lead]):
            rows = self.ints([math.prod(dx_shape[:lead])])
        else:  # R = size / F, at run time
            rows = self.op("Reshape", self.op("Div", self.op("Size", dx), self.const(width, np.int64)), self.ints([1]))
        ones = self.op("ConstantOfShape", rows, value=ir.tensor(np.ones(1, np.float32)))
        rows_x = dx if len(dx_shape) == 2 and lead == 1 else self.op("Reshape", dx, self.ints([-1, width]))
        summed = self.op("MatMul", ones, rows_x)  # [F]
        return summed if len(rest) == 1 else self.op("Reshape", summed, self.ints(list(rest)))

    @staticmethod
    def _broadcast_axes(dx_shape: StaticShape, ts: StaticShape) -> list[int] | None:
        lead = len(dx_shape) - len(ts)
        if lead < 0:
            return None
        axes = list(range(lead))
        for i, (a, b) in enumerate(zip(dx_shape[lead:], ts)):
            if b == 1:
                if a != 1:
                    axes.append(lead + i)
            elif not same_dim(a, b):
                if isinstance(b, int) and isinstance(a, (str, type(None))):
                    continue  # a fixed target dim > 1: the broadcast dim must equal it
                return None
        return axes

    def _sum_to_dynamic(self, dx: ir.Value, target: ir.Value) -> ir.Value:
        self.require_opset(13, "ReduceSum with run-time axes (to undo broadcasting over symbolic dims)")
        sy = self.op("Shape", dx)
        sx = self.op("Shape", target)
        diff = self.op("Sub", self.op("Size", sy), self.op("Size", sx))
        ones = self.op("ConstantOfShape", self.op("Reshape", diff, self.ints([1])),
                       value=ir.tensor(np.ones(1, dtype=np.int64)))
        sx_padded = self.op("Concat", ones, sx, axis=0)
        mask = self.op("Not", self.op("Equal", sx_padded, sy))
        axes = self.op("Reshape", self.op("NonZero", mask), self.ints([-1]))
        summed = self.reduce("ReduceSum", dx, axes)
        return self.reshape_to(summed, sx)

