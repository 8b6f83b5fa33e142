"""``gc.utils.checkpoint``: torch.utils.checkpoint's ``checkpoint`` and ``checkpoint_sequential``.

In a capture, the nodes a region's function emits are marked with the region's id (node metadata
``CHECKPOINT_KEY``); the training graphs' backward then recomputes the values it reads from them,
starting from the region's inputs (``passes/training/recompute.py``), and the forward is unchanged.
A region inside another is part of it; one inside a control-flow body is recomputed by each
unrolled step of the body's gradient, or, where the steps are not unrolled (reverse mode), by each
step of the backward loop from the step's taped inputs; under ``gc.vmap`` the batched ops join the
region. One inside a ``gc.autograd.Function``'s backward is recomputed where that backward is
differentiated again (``create_graph=True``: a gradient penalty), as torch's; a first-order gradient
makes the backward's values once, in the backward, and keeps none to recompute.
Outside a capture the function just runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from graphc.dsl import builder
from graphc.dsl.grad_hooks import checkpoint_region
from graphc.model import CHECKPOINT_KEY

__all__ = ["checkpoint", "checkpoint_sequential"]

_DETERMINISM_CHECKS = ("default", "none")


def checkpoint(function: Callable, *args: Any, use_reentrant: bool | None = None, context_fn: Callable | None = None,
               determinism_check: str = "default", debug: bool = False, early_stop: bool = True,
               preserve_rng_state: bool = True, **kwargs: Any) -> Any:
    """``function(*args, **kwargs)``, its activations recomputed in the backward of the training
    graphs instead of kept (torch.utils.checkpoint.checkpoint). Both of torch's variants
    (``use_reentrant`` True, False or None) give the same graphs: the gradients are
    non-reentrant torch's. Random draws in the region are not drawn again (Dropout's recomputed
    mask is the forward's), whatever ``preserve_rng_state`` says. ``context_fn`` (selective
    checkpointing) and ``debug=True`` are refused; ``determinism_check`` is ``"default"`` or ``"none"``
    (the copies run the same ops on the same inputs)."""
    if use_reentrant and kwargs:
        raise ValueError(f"checkpoint: keyword arguments {', '.join(sorted(kwargs))} for the function need "
                         f"use_reentrant=False, as torch's")
    if context_fn is not None:
        raise ValueError("checkpoint: context_fn (torch's selective checkpointing policies) is not supported: "
                         "graphc recomputes every value of the region; leave context_fn out")
    if debug:
        raise ValueError("checkpoint: debug=True (torch's trace of the recomputed ops) is not supported: the "
                         "recomputed nodes are in the training graphs, named recompute/... (graphc view)")
    if determinism_check not in _DETERMINISM_CHECKS:
        raise ValueError(f"checkpoint: determinism_check must be one of {_DETERMINISM_CHECKS}, "
                         f"got {determinism_check!r}")
    b = builder.active()
    if b is None:
        return function(*args, **kwargs)
    nodes = b.scope.nodes
    start = len(nodes)
    with checkpoint_region(b):
        out = function(*args, **kwargs)
    region = b.unique(CHECKPOINT_KEY)
    for node in nodes[start:]:
        node.metadata_props[CHECKPOINT_KEY] = region
    return out


def checkpoint_sequential(functions: Sequence[Callable] | Any, segments: int, input: Any,
                          use_reentrant: bool | None = None, **kwargs: Any) -> Any:
    """``functions`` (a list of callables or a ``gc.nn.Sequential``) applied in order to ``input``,
    cut into ``segments`` runs of ``len(functions) // segments``: each run but the last is one
    checkpoint region (torch.utils.checkpoint.checkpoint_sequential; the last run, which takes
    the remainder, is not checkpointed). ``preserve_rng_state`` is the only keyword taken."""
    preserve = kwargs.pop("preserve_rng_state", True)
    if kwargs:
        raise ValueError(f"checkpoint_sequential: unexpected keyword arguments {', '.join(sorted(kwargs))}")
    if hasattr(functions, "children"):
        functions = list(functions.children())
    functions = list(functions)
    if isinstance(segments, bool) or not isinstance(segments, int) or not 1 <= segments <= len(functions):
        raise ValueError(f"checkpoint_sequential: segments must be an int from 1 to the {len(functions)} "
                         f"functions, got {segments!r}")
    size = len(functions) // segments

    def run(part: list[Callable]) -> Callable:
        def forward(x: Any) -> Any:
            for f in part:
                x = f(x)
            return x
        return forward

    end = 0
    for start in range(0, size * (segments - 1), size):
        end = start + size
        input = checkpoint(run(functions[start:end]), input, use_reentrant=use_reentrant,
                           preserve_rng_state=preserve)
    return run(functions[end:])(input)
