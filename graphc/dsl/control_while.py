"""``gc.while_loop``: ``torch.while_loop`` (and ``jax.lax.while_loop`` for one carried value or tree) as one
ONNX ``Loop`` with no trip count whose body computes its own condition. ``cond_fn`` is traced twice: on the
initial carries, outside the Loop (its ``cond`` input, so zero steps are possible: while, not do-while),
and in the body on ``body_fn``'s results (the body's condition output). In eager capture the Loop is run by
``control.run_loop``. Gradients come from the autodiff pass's reverse-mode Loop rule, which records each
step's carries; ``gc.vmap`` batches it by the Loop rule when the condition is the same for every example,
else runs the body as a Scan."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from graphc.dsl import complex_carries, renorm
from graphc.dsl.builder import current, op_error, operand_text, user_source
from graphc.dsl.control import merge_shape, run_loop, trace_subgraph
from graphc.dsl.tensor import ComplexTensor, Tensor
from graphc.dsl.trees import leaves, rebuild
from graphc.errors import CaptureError

__all__ = ["while_loop"]

_API = "gc.while_loop"


def _tensors(what: str, tree: Any, source: str) -> tuple[list[str], list[Tensor | ComplexTensor]]:
    """The paths and leaves of ``tree``, each a Tensor or ComplexTensor (numbers and arrays lifted), or an
    error naming the leaf."""
    paths, tensors = [], []
    for path, leaf in leaves(tree, what):
        if not isinstance(leaf, (Tensor, ComplexTensor, np.ndarray, np.generic, int, float, complex)):
            raise CaptureError(f"{_API}: {path} is a {type(leaf).__name__}; expected a Tensor (or a number), in "
                               f"tuples, lists and dicts (at {source})")
        paths.append(path)
        tensors.append(complex_carries.item(leaf))
    return paths, tensors


def _condition(result: Any, where: str, source: str) -> Tensor:
    """``cond_fn``'s result, checked: a bool scalar Tensor."""
    if not isinstance(result, Tensor):
        kind = "a Python bool, fixed at capture" if isinstance(result, (bool, np.bool_)) else type(result).__name__
        raise CaptureError(f"{_API}: cond_fn{where} returned {kind}; expected a bool scalar Tensor computed from "
                           f"the carried values (at {source})")
    if result.dtype != "bool" or (result.shape is not None and len(result.shape) != 0):
        raise op_error("Loop", [result], f"{_API}: cond_fn{where} must return a bool scalar Tensor (shape []), "
                       f"got {operand_text(result)}", source)
    return result


def while_loop(cond_fn: Callable, body_fn: Callable, carried_inputs: Any) -> Any:
    """``while cond_fn(*carried): carried = body_fn(*carried)``, returning ``carried``, as an ONNX ``Loop``
    (torch's ``torch.while_loop``). ``carried_inputs`` is a tuple (or list) of Tensors, numbers, or
    tuples/lists/dicts of them; a single Tensor or dict is passed whole (JAX's ``lax.while_loop``) and
    returned as such. ``cond_fn`` must return a bool scalar Tensor; ``body_fn`` the carried values with the
    same dtypes and shapes, in the same order (a lone Tensor for one). Signature: ai.onnx@21::Loop"""
    builder, source = current(), user_source()
    unpack = isinstance(carried_inputs, (tuple, list))
    tree = tuple(carried_inputs) if unpack else (carried_inputs,)
    paths, init = _tensors("carried_inputs" if unpack else "carried_inputs[0]", tree, source)
    if not init:
        raise CaptureError(f"{_API}: carried_inputs holds no Tensors (at {source})")
    if not unpack:
        paths = [p.replace("carried_inputs[0]", "carried_inputs", 1) for p in paths]

    def call(fn: Callable, items: list[Tensor]) -> Any:
        args = rebuild(tree, iter(items))
        return fn(*args) if unpack else fn(args[0])

    first = _condition(call(cond_fn, init), "", source)
    flat, kinds = complex_carries.split(init)

    def body(iter_num: Tensor, cond_in: Tensor, *state: Tensor) -> list[Tensor]:
        _, new = _tensors("body_fn's result", call(body_fn, complex_carries.join(state, kinds)), source)
        if len(new) != len(init):
            raise CaptureError(f"{_API}: body_fn returns {len(new)} carried values, carried_inputs has {len(init)} "
                               f"(at {source})")
        for path, a, b in zip(paths, init, new):
            if a.dtype != b.dtype or (a.shape is not None and b.shape is not None and (
                    len(a.shape) != len(b.shape) or any(isinstance(x, int) and isinstance(y, int) and x != y
                                                        for x, y in zip(a.shape, b.shape)))):
                raise op_error("Loop", [a, b], f"{_API}: body_fn changes {path} from {operand_text(a)} to "
                               f"{operand_text(b)}; each step must keep the dtype and shape", source)
        return [_condition(call(cond_fn, new), " (on body_fn's result)", source), *complex_carries.split(new)[0]]

    in_types = [("iter", "int64", []), ("cond", "bool", [])] + [
        (f"carry{k}", t.dtype, t.shape) for k, t in enumerate(flat)]
    carried: list[renorm.Carried] = []
    graph, outs, _ = trace_subgraph(builder, body, [], in_types, "while_body", carried)
    out_types = [(t.dtype, merge_shape(t.shape, o.shape)) for t, o in zip(flat, outs[1:])]
    results = renorm.emit_carrying("Loop", [None, first, *flat], {"body": graph}, out_types, len(flat), carried,
                                   source, lambda arrays: run_loop(builder, graph, arrays))
    final = rebuild(tree, iter(complex_carries.join(results, kinds)))
    return final if unpack else final[0]

