"""``gc.autograd.grad``: torch's ``autograd.grad`` on Tensors already computed in a capture.

The nodes between ``inputs`` and ``outputs`` are differentiated where the call is, by the autodiff pass's
rules, as ``gc.func``'s transforms differentiate a traced function (``func_transforms.traced_between``):
the gradient nodes join the graph after them. ``create_graph=False`` reads each gradient through a
``gc.detach`` (torch's gradients then carry no history), so training does not differentiate through it;
``create_graph=True`` leaves it on the graph, and training takes the second-order terms.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from graphc.dsl import ops
from graphc.dsl.builder import user_source
from graphc.dsl.func_transforms import traced_between
from graphc.dsl.ops_array import ones_like, zeros_like
from graphc.dsl.tensor import Tensor
from graphc.dsl.vmap import vmap
from graphc.errors import CaptureError
from graphc.model.dtypes import FLOAT_DTYPES

__all__ = ["grad"]

_API = "gc.autograd.grad"


def _tensors(what: str, value: Any, source: str, none_ok: bool = False) -> list[Any]:
    """torch's reading of ``outputs`` / ``inputs`` / ``grad_outputs``: one Tensor, or a sequence of them
    (numpy arrays lifted; None where ``none_ok``)."""
    items = [value] if isinstance(value, (Tensor, np.ndarray)) else value
    if not isinstance(items, (tuple, list)):
        raise CaptureError(f"{_API}: {what} takes a Tensor or a sequence of Tensors, got {type(value).__name__} "
                           f"(at {source})")
    out = []
    for i, t in enumerate(items):
        if isinstance(t, np.ndarray):
            t = ops.lift(t)
        if not (isinstance(t, Tensor) or (t is None and none_ok)):
            raise CaptureError(f"{_API}: {what}[{i}] is {type(t).__name__}; expected a Tensor"
                               f"{' or None' if none_ok else ''} (at {source})")
        out.append(t)
    return out


def static_numel(t: Tensor) -> int | None:
    """The number of entries where every dim is an int, else None (unlike ``gc.numel``, which raises)."""
    if t.shape is None or not all(isinstance(d, int) for d in t.shape):
        return None
    return math.prod(t.shape)


def _seeds(outputs: list[Tensor], grad_outputs: Any, batched: bool, source: str) -> list[Tensor]:
    """One cotangent per output, as torch's ``_make_grads``: ones for a None given a one-element output,
    a float one cast to the output's dtype; torch's error texts otherwise."""
    given = [None] * len(outputs) if grad_outputs is None else _tensors("grad_outputs", grad_outputs, source, True)
    if len(given) != len(outputs):
        raise CaptureError(f"{_API}: got {len(outputs)} tensors and {len(given)} gradients: grad_outputs takes one "
                           f"per output (at {source})")
    seeds = []
    for k, (out, ct) in enumerate(zip(outputs, given)):
        if ct is None:
            if batched or static_numel(out) != 1:
                raise CaptureError(f"{_API}: grad can be implicitly created only for scalar outputs: output {k} is "
                                   f"{out.type_str()}; pass grad_outputs (at {source})")
            seeds.append(ones_like(out))
            continue
        if ct.shape is not None and out.shape is not None and (
                (batched and not ct.ndim) or tuple(ct.shape[1:] if batched else ct.shape) != tuple(out.shape)):
            lead = "If `is_grads_batched=True`, the first dimension of each grad_output is the batch dimension: " \
                if batched else ""
            raise CaptureError(f"{_API}: {lead}Mismatch in shape: grad_output[{k}] has a shape of {list(ct.shape)} "
                               f"and output[{k}] has a shape of {list(out.shape)} (at {source})")
        seeds.append(ct if ct.dtype == out.dtype else ops.cast(ct, out.dtype))
    return seeds


def grad(outputs: Any, inputs: Any, grad_outputs: Any = None, retain_graph: bool | None = None,
         create_graph: bool = False, only_inputs: bool = True, allow_unused: bool | None = None,
         is_grads_batched: bool = False, materialize_grads: bool = False) -> tuple | dict:
    """torch's ``autograd.grad``: the sum over ``outputs`` of ``<output, grad_output>`` differentiated by
    each of ``inputs`` (a Tensor, a sequence, or a dict: the result then a dict with its keys), through
    the nodes computed between them in this capture. ``grad_outputs`` may be None (or hold None) only for
    one-element outputs; ``is_grads_batched``: its first dim is a batch of cotangents (``gc.vmap``). An
    input no path reaches is an error unless ``allow_unused`` (None for it) or ``materialize_grads``
    (zeros). ``create_graph=False``: the gradients are detached; True: training differentiates through
    them. ``retain_graph`` and ``only_inputs`` are accepted as torch's (a graph is never freed)."""
    source = user_source()
    if materialize_grads and allow_unused is False:
        raise CaptureError(f"{_API}: Expected allow_unused to be True or not passed when materialize_grads=True, "
                           f"but got: allow_unused=False (at {source})")
    allow_unused = materialize_grads if allow_unused is None else allow_unused
    keys = list(inputs) if type(inputs) is dict else None
    outs = _tensors("outputs", outputs, source)
    ins = _tensors("inputs", list(inputs.values()) if keys is not None else inputs, source)
    if not ins:
        raise CaptureError(f"{_API}: `inputs` argument to `grad()` cannot be empty (at {source})")
    for what, items in (("output", outs), ("input", ins)):
        for k, t in enumerate(items):
            if t.dtype not in FLOAT_DTYPES:
                raise CaptureError(f"{_API}: {what} {k} ({t.type_str()}, {t.name!r}) is not floating-point; only "
                                   f"floating-point Tensors have gradients (torch: it does not require grad) "
                                   f"(at {source})")
    seeds = _seeds(outs, grad_outputs, is_grads_batched, source)
    traced = traced_between(_API, outs, ins, source)
    if is_grads_batched:
        grads = list(vmap(lambda *cts: traced.backward(list(cts)))(*seeds))
    else:
        grads = traced.backward(seeds)
    results: list[Tensor | None] = []
    for k, g in enumerate(grads):
        if k in traced.unused:
            if not allow_unused:
                raise CaptureError(f"{_API}: The differentiated Tensor at index {k} ({ins[k].type_str()}, "
                                   f"{ins[k].name!r}) appears to not have been used in the graph: no path from it "
                                   f"reaches the outputs. Set allow_unused=True if this is the desired behavior "
                                   f"(at {source})")
            results.append(zeros_like(ins[k]) if materialize_grads else None)
        else:
            results.append(g if create_graph else ops.detach(g))
    return dict(zip(keys, results)) if keys is not None else tuple(results)
