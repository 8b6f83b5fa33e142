"""Control flow: If, Loop, Scan. Subgraphs are ``Plan``s; they read outer-scope values from
the running graph (``ctx.scope``)."""

from __future__ import annotations

import numpy as np

from graphc.backends.numpy.kernels import kernel, scalar


def _one(value, what: str, default=None):
    """The single value of a condition or trip count; anything but one element is refused (an
    empty one read as absent ran an If's else branch, or a Loop forever)."""
    if value is not None and np.size(value) != 1:
        raise ValueError(f"{what} must hold exactly one value, got shape {list(np.shape(value))}")
    return scalar(value, default)


@kernel("If", since=1, context=True)
def if_(ctx, cond, *, then_branch, else_branch):
    branch = then_branch if bool(_one(cond, "If's cond")) else else_branch
    return tuple(branch.call(ctx, []))


def _stack(items, body, index):
    """The values ``body``'s output ``index`` took, stacked on a new axis 0. None of them: an
    empty tensor of its static shape (unknown dims 0, an unknown rank [0]), as onnxruntime's.
    Every iteration's value must have the first one's shape (a loop-carried value may change
    shape, a scan output may not)."""
    if not items:
        dims = body.output_dims[index]
        return np.zeros((0, *(dims or ())), body.output_dtypes[index] or np.float32)
    if isinstance(items[0], list):  # a sequence scanned out stays a list of sequences
        return items
    first = np.shape(items[0])
    for step, item in enumerate(items):
        if np.shape(item) != first:
            raise ValueError(f"scan output {body.output_names[index]!r} has shape {list(np.shape(item))} at "
                             f"iteration {step}, {list(first)} at iteration 0 (a scan output keeps one shape)")
    return np.stack(items)


@kernel("Loop", since=1, context=True)
def loop(ctx, max_trip_count=None, cond=None, *initial, body):
    """Runs ``body(i, cond, *carried) -> (cond, *carried, *scan_slices)``."""
    trips = _one(max_trip_count, "Loop's trip count M")
    keep = bool(_one(cond, "Loop's cond", True))
    carried = list(initial)
    n_carried = len(carried)
    scanned: list[list] = [[] for _ in range(len(body.output_names) - 1 - n_carried)]
    i = 0
    while keep and (trips is None or i < trips):
        outs = body.call(ctx, [np.array(i, np.int64), np.array(keep), *carried])
        keep = bool(scalar(outs[0]))
        carried = outs[1:1 + n_carried]
        for acc, value in zip(scanned, outs[1 + n_carried:]):
            acc.append(value)
        i += 1
    return (*carried, *(_stack(acc, body, 1 + n_carried + k) for k, acc in enumerate(scanned)))


def _scan_length(xs, in_axes, input_names) -> int:
    """The scanned axes' common length; an axis outside a scanned input's rank, or lengths that
    differ, are refused (the shorter one was read past, or the longer one cut short)."""
    lengths = []
    for k, (x, axis, name) in enumerate(zip(xs, in_axes, input_names)):
        if not -x.ndim <= axis < x.ndim:
            raise ValueError(f"scan_input_axes[{k}] is {axis}, outside [{-x.ndim}, {x.ndim - 1}] for scan input "
                             f"{k} (body input {name!r}) of shape {list(x.shape)}")
        lengths.append(x.shape[axis])
        if lengths[k] != lengths[0]:
            raise ValueError(f"scan input {k} (body input {name!r}) has length {lengths[k]} on its scanned axis {axis}, "
                             f"while scan input 0 has {lengths[0]} (scanned inputs have one length)")
    return lengths[0] if lengths else 0


def _scan(ctx, states, xs, body, in_axes, in_dirs, out_axes, out_dirs):
    n_state = len(states)
    length = _scan_length(xs, in_axes, body.input_names[n_state:])
    collected: list[list] = [[] for _ in range(len(body.output_names) - n_state)]
    for t in range(length):
        slices = [np.take(x, length - 1 - t if d else t, axis=a) for x, a, d in zip(xs, in_axes, in_dirs)]
        outs = body.call(ctx, [*states, *slices])
        states = outs[:n_state]
        for acc, value in zip(collected, outs[n_state:]):
            acc.append(value)
    results = []
    for k, (acc, axis, backward) in enumerate(zip(collected, out_axes, out_dirs)):
        stacked = _stack(acc, body, n_state + k)
        stacked = stacked[::-1] if backward else stacked
        if not -stacked.ndim <= axis < stacked.ndim:
            raise ValueError(f"scan_output_axes[{k}] is {axis}, outside [{-stacked.ndim}, {stacked.ndim - 1}] for "
                             f"scan output {body.output_names[n_state + k]!r} of shape {list(stacked.shape)}")
        results.append(np.moveaxis(stacked, 0, axis))
    return (*states, *results)


@kernel("Scan", since=8, context=True)
def scan_v8(ctx, sequence_lens, *args, body, num_scan_inputs, directions=None):
    """Opset 8: every input has a leading batch axis; the scan axis is 1."""
    n_state = len(args) - num_scan_inputs
    dirs = list(directions or [0] * num_scan_inputs)
    n_out = len(body.output_names) - n_state
    per_batch = [
        _scan(ctx, [s[b] for s in args[:n_state]], [x[b] for x in args[n_state:]], body,
              [0] * num_scan_inputs, dirs, [0] * n_out, [0] * n_out)
        for b in range(args[0].shape[0])]
    return tuple(np.stack([r[i] for r in per_batch]) for i in range(len(per_batch[0])))


@kernel("Scan", since=9, context=True)
def scan(ctx, *args, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None,
         scan_output_axes=None, scan_output_directions=None):
    n_state = len(args) - num_scan_inputs
    n_out = len(body.output_names) - n_state
    return _scan(ctx, list(args[:n_state]), list(args[n_state:]), body,
                 list(scan_input_axes or [0] * num_scan_inputs),
                 list(scan_input_directions or [0] * num_scan_inputs),
                 list(scan_output_axes or [0] * n_out), list(scan_output_directions or [0] * n_out))
