"""VJP rules of MatMul (batched, broadcast, 1-D operands), Gemm (transA/transB/alpha/beta), Einsum and Det."""

from __future__ import annotations

import math
import string

import numpy as np
import onnx_ir as ir

from graphc.errors import GraphError
from graphc.passes.autodiff.builder import GradBuilder, attr, static_shape
from graphc.passes.autodiff.channel_scale import channel_scaled
from graphc.passes.autodiff.registry import grad_rule


def _flatten_rows(g: GradBuilder, x: ir.Value, shape, like_last: ir.Value) -> ir.Value:
    """Reshape ``x`` (rank >= 2) to ``[-1, last]``."""
    last = shape[-1]
    if isinstance(last, int):
        return g.op("Reshape", x, g.ints([-1, last]))
    tail = g.op("Slice", g.op("Shape", like_last), g.ints([-1]), g.ints([2**62]))
    return g.op("Reshape", x, g.op("Concat", g.ints([-1]), tail, axis=0))


@grad_rule("MatMul")
def grad_matmul(g, node, dy):
    # y = a @ b (numpy semantics): da = dy @ b^T, db = a^T @ dy, in the broadcast batch dims
    # (the driver sums those). 1-D operands are lifted to matrices ([k] -> [1,k] / [k,1]): a's
    # gradient keeps the leading 1, which the driver sums away with the batch dims; b's
    # trailing 1 is squeezed here.
    a, b = node.inputs
    sa, sb, sy = static_shape(a), static_shape(b), static_shape(node.outputs[0])
    ra, rb = g.rank(a), g.rank(b)
    g.rank(node.outputs[0])
    if ra == 1 and rb == 1:
        return (g.broadcast_from(g.mul(dy, b), sb) if g.wants(a) else None), \
            (g.broadcast_from(g.mul(dy, a), sa) if g.wants(b) else None)
    fold = _batch_fold(g, node, dy)  # dy = z * k along the batch: k into b for da, times db
    if fold is not None:
        dy = fold[0]
    a2, sa2, b2, sb2, dy2, sy2 = a, sa, b, sb, dy, sy
    if ra == 1:
        a2, sa2 = g.unsqueeze(a, [0]), (1, *sa)
        dy2, sy2 = g.unsqueeze(dy, [len(sy) - 1]), (*sy[:-1], 1, sy[-1])
    if rb == 1:
        b2, sb2 = g.unsqueeze(b, [1]), (*sb, 1)
        dy2, sy2 = g.unsqueeze(dy, [len(sy)]), (*sy, 1)
    da = db = None
    if g.wants(a):
        b2 = b2 if fold is None else g.mul(b, fold[1])
        da = g.broadcast_from(g.op("MatMul", dy2, g.swap_last(b2, len(sb2))), (*sy2[:-2], sy2[-2], sb2[-2]))
    if g.wants(b):
        if rb == 2 and ra > 2:
            # b is a weight shared over a's batch: one [k, rows] @ [rows, m] product
            db = g.broadcast_from(g.op("Gemm", _flatten_rows(g, a2, sa2, a2), _flatten_rows(g, dy2, sy2, dy2),
                                       transA=1), sb2)
        elif rb == 1:
            db = g.broadcast_from(g.squeeze(g.op("MatMul", g.swap_last(a2, len(sa2)), dy2), [len(sy2) - 1]),
                                  (*sy2[:-2], sa2[-1]))
        else:
            db = g.broadcast_from(g.op("MatMul", g.swap_last(a2, len(sa2)), dy2), (*sy2[:-2], sa2[-1], sy2[-1]))
        db = db if fold is None else g.broadcast_from(g.mul(db, fold[1]), sb)
    return da, db


def _batch_fold(g: GradBuilder, node: ir.Node, dy: ir.Value) -> tuple[ir.Value, ir.Value] | None:
    """(z, k as [B, 1, 1]) where ``dy`` of a product batched over B ([B, M, K] x [B, K, N], no
    broadcast) is a BatchNorm's z * k with k along that batch (``channel_scale``: a depthwise
    conv ``dense_conv`` made one product per channel, ``_group_products``) and k times b, and
    times b's gradient, are fewer values than dy; else None. EfficientNet-B0 at batch 32, 64 px:
    its four depthwise convs on 2x2 maps ([32, 1152, 2, 2] against [1152, 4, 4]); 1 thread, each
    node the fastest of 4 interleaved profiles, the four dy * k 1.02 ms a step against 0.15 for
    the eight products by k made instead. On 4x4 maps the matrices are as large as dy ([C, 16,
    16] against [32, C, 16]): not taken."""
    shapes = [static_shape(v) for v in (dy, *node.inputs)]
    if any(s is None or len(s) != 3 or not all(isinstance(d, int) for d in s) for s in shapes):
        return None
    if len({s[0] for s in shapes}) != 1 or math.prod(shapes[2]) * (g.wants(node.inputs[0]) + g.wants(
            node.inputs[1])) >= math.prod(shapes[0]):
        return None
    scaled = channel_scaled(g, dy, (0,))
    return None if scaled is None else (scaled[0], g.op("Reshape", scaled[1], g.ints([-1, 1, 1])))


@grad_rule("Gemm", broadcast=(2,))
def grad_gemm(g, node, dy):
    # y = alpha * A' @ B' + beta * C with A' = A^T if transA, B' = B^T if transB.
    # A BatchNorm's dx after a conv ``dense_conv`` made a Gemm keeps its product by k
    # (``channel_scale``): folded here as into a Conv (the weight times k for dA, dB times k),
    # the two weight-sized products cost what the one dy * k did, the maps being 16 pixels or
    # fewer. 1 thread, batch 32, 64 px, each node the fastest of 4 interleaved profiles, ms a
    # step: where the weight (times two) has fewer values than dy, EfficientNet-B0 7 of them, dy
    # * k 0.23 against 0.28; ResNet-18 1 (the 1x1 shortcut on 4x4), 0.02 against 0.03; folded
    # everywhere, ResNet-18's 10 0.37 against 4.85. None at batch 2 or in ResNet-50.
    a, b = node.inputs[0], node.inputs[1]
    c = node.inputs[2] if len(node.inputs) > 2 else None
    alpha, beta = attr(node, "alpha", 1.0), attr(node, "beta", 1.0)
    ta, tb = attr(node, "transA", 0), attr(node, "transB", 0)
    scale = {} if alpha == 1.0 else {"alpha": alpha}
    da = db = dc = None
    if g.wants(a):
        if ta:  # dA = alpha * B' dy^T
            da = g.op("Gemm", b, dy, transA=int(bool(tb)), transB=1, **scale)
        else:  # dA = alpha * dy B'^T
            da = g.op("Gemm", dy, b, transB=int(not tb), **scale)
    if g.wants(b):
        if tb:  # dB = alpha * dy^T A'
            db = g.op("Gemm", dy, a, transA=1, transB=int(bool(ta)), **scale)
        else:  # dB = alpha * A'^T dy
            db = g.op("Gemm", a, dy, transA=int(not ta), **scale)
    if g.wants(c):
        dc = dy if beta == 1.0 else g.mul(dy, g.scalar(beta, dy))
    return da, db, dc


def _parse_einsum(equation: str, n_inputs: int) -> tuple[list[str], str] | None:
    """Operand subscripts and output subscripts (the implicit output made explicit: the letters
    used once, in alphabetical order, after the ellipsis if any, as numpy and ONNX define it),
    or None for a letter repeated in the output."""
    eq = equation.replace(" ", "")
    lhs, out = eq.split("->") if "->" in eq else (eq, None)
    terms = lhs.split(",")
    letters = [c for t in terms for c in t.replace("...", "")]
    if out is None:
        once = sorted(c for c in set(letters) if letters.count(c) == 1)
        out = ("..." if "..." in lhs else "") + "".join(once)
    if len(terms) != n_inputs or len(set(out.replace("...", ""))) != len(out.replace("...", "")):
        return None
    return terms, out


def _diagonals(g: GradBuilder, node: ir.Node, terms: list[str], out: str) -> tuple[list[str], list]:
    """The terms with each repeat of a letter within one (a diagonal, ``ii->i``) relabelled by a
    fresh letter, and the identity matrices ``(subscripts, value)`` that tie each fresh letter to
    the one it repeats: the einsum of the relabelled terms and the identities is the node's."""
    used = set("".join(terms) + out)
    fresh = iter(c for c in string.ascii_letters if c not in used)
    relabelled, eyes = [], []
    for term, x in zip(terms, node.inputs):
        shape, chars = static_shape(x), list(term)
        for k, c in enumerate(term):
            if c == "." or c not in term[:k]:
                continue
            axis = k if "..." not in term or k < term.index("...") else len(shape or ()) - (len(term) - k)
            if shape is None or not isinstance(shape[axis], int):
                raise GraphError(f"gradient of Einsum {node.name!r}: the diagonal of {c!r} in {term!r} needs a "
                                 f"static size (input {x.name!r} has shape {shape})")
            chars[k] = next(fresh)
            eyes.append((c + chars[k], g.const(np.eye(shape[axis]), x.dtype)))
        relabelled.append("".join(chars))
    return relabelled, eyes


def _letter_dims(terms: list[str], shapes: list, letter: str, skip: int) -> list:
    """The static dims ``letter`` has in the terms other than ``skip`` (where their shapes are known)."""
    return [shape[term.index(letter)] for j, (term, shape) in enumerate(zip(terms, shapes))
            if j != skip and letter in term and shape is not None and len(shape) == len(term)]


@grad_rule("Einsum")
def grad_einsum(g, node, dy):
    # d term_i = einsum(out, other terms -> term_i); a letter that only term_i has (summed away
    # in the forward) is broadcast back by multiplying with ones of that operand's shape, as is
    # one whose dim other operands have as 1 only (a labelled dim broadcast as numpy does). A
    # labelled dim of 1 that the others have larger is marked broadcast: the driver sums it. With
    # "...", the operands' ellipsis dims broadcast: each gradient keeps them ("..." added to an
    # operand that has none), in a shape known at run time only, which the driver sums back. A
    # diagonal (a letter repeated in one operand) is read through identity matrices (``_diagonals``),
    # which put each gradient back on it.
    equation = attr(node, "equation")
    parsed = _parse_einsum(equation, len(node.inputs))
    if parsed is None:
        raise GraphError(f"gradient of Einsum {node.name!r} with equation {equation!r} is not supported "
                         "(a letter repeated in the output)")
    terms, eyes = _diagonals(g, node, *parsed)
    out = parsed[1]
    all_terms = [*terms, *(t for t, _ in eyes), out]
    shapes = [*(static_shape(v) for v in [*node.inputs, *(e for _, e in eyes)]), static_shape(node.outputs[0])]
    grads = []
    for i, (x, term) in enumerate(zip(node.inputs, terms)):
        if not g.wants(x):
            grads.append(None)
            continue
        others = [(t, v) for j, (t, v) in enumerate(zip(terms, node.inputs)) if j != i] + eyes
        seen = set(out) | {c for t, _ in others for c in t}
        operands, subs = [dy], [out]
        for t, v in others:
            operands.append(v)
            subs.append(t)
        sx = shapes[i] if "..." not in term else None
        dims = {c: _letter_dims(all_terms, shapes, c, i) for c in term} if sx is not None else {}
        spread = any(sx[k] != 1 and dims[c] and all(d == 1 for d in dims[c]) for k, c in enumerate(term)) \
            if sx is not None else False
        if not set(term) <= seen or spread:  # letters only this operand has (in a size > 1)
            operands.append(g.full(g.shape_of(x), 1.0, x))
            subs.append(term)
        target = term if "..." in term or not any("..." in t for t in subs) else "..." + term
        dx = g.op("Einsum", *operands, equation=",".join(subs) + "->" + target)
        if "..." in target:
            dx = g.broadcast_from(dx, None)
        elif sx is not None and any(sx[k] == 1 and any(d != 1 for d in dims[c]) for k, c in enumerate(term)):
            dx = g.broadcast_from(dx, tuple(d if d != 1 else None for d in sx))  # None: summed over
        grads.append(dx)
    return tuple(grads)


@grad_rule("Det")
def grad_det(g, node, dy):
    # d det(A) / dA = the cofactor matrix, C[i, j] = (-1)^(i+j) det(A without row i and column j):
    # no inverse (ONNX has none, and det * inv(A)^T is undefined where A is singular, where the
    # cofactors are exact). All n^2 minors come from two Gathers of the other rows and columns.
    a = node.inputs[0]
    shape, rank = static_shape(a), g.rank(a)
    n = shape[-1]
    if not isinstance(n, int):
        raise GraphError(f"gradient of Det {node.name!r} needs the matrix size static, got shape {shape}")
    dy = g.unsqueeze(dy, [rank - 2, rank - 1])
    if n == 1:
        return (g.op("Expand", dy, g.shape_of(a)),)
    others = g.const(np.array([[k for k in range(n) if k != i] for i in range(n)], np.int64))  # [n, n-1]
    minors = g.op("Gather", g.op("Gather", a, others, axis=rank - 2), others, axis=rank)  # [..., i, r, j, c]
    lead = list(range(rank - 2))
    cofactors = g.op("Det", g.transpose(minors, lead + [rank - 2, rank, rank - 1, rank + 1]))
    signs = g.const(np.fromfunction(lambda i, j: (-1.0) ** (i + j), (n, n)), a.dtype)
    return (g.mul(dy, g.mul(cofactors, signs)),)
