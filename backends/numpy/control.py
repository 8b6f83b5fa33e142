"""Control flow: If, Loop, Scan. Subgraphs are ``Plan``s; they read outer-scope values from
the running graph (``ctx.scope``)."""

from __future__ import annotations

import numpy as np

from graphc.backends.numpy.kernels import kernel, scalar


@kernel("If", since=1, context=True)
def if_(ctx, cond, *, then_branch, else_branch):
    branch = then_branch if bool(scalar(cond)) else else_branch
    return tuple(branch.call(ctx, []))


def _stack(items, body, index):
    """The values ``body``'s output ``index`` took, stacked on a new axis 0. None of them: an
    empty tensor of its static shape (unknown dims 0, an unknown rank [0]), as onnxruntime's."""
    if not items:
        dims = body.output_dims[index]
        return np.zeros((0, *(dims or ())), body.output_dtypes[index] or np.float32)
    if isinstance(items[0], list):  # a sequence scanned out stays a list of sequences
        return items
    return np.stack(items)


@kernel("Loop", since=1, context=True)
def loop(ctx, max_trip_count=None, cond=None, *initial, body):
    """Runs ``body(i, cond, *carried) -> (cond, *carried, *scan_slices)``."""
    trips = scalar(max_trip_count)
    keep = bool(scalar(cond, True))
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


def _scan(ctx, states, xs, body, in_axes, in_dirs, out_axes, out_dirs):
    n_state = len(states)
    length = xs[0].shape[in_axes[0]] if xs else 0
    collected: list[list] = [[] for _ in range(len(body.output_names) - n_state)]
    for t in range(length):
        slices = [np.take(x, length - 1 - t if d else t, axis=a) for x, a, d in zip(xs, in_axes, in_dirs)]
        outs = body.call(ctx, [*states, *slices])
        states = outs[:n_state]
        for acc, value in zip(collected, outs[n_state:]):
            acc.append(value)
    results = []
    for k, (acc, axis, backward) in enumerate(zip(collected, out_axes, out_dirs)):
        stacked = _stack(acc[::-1] if backward else acc, body, n_state + k)
        results.append(np.moveaxis(stacked, 0, axis % stacked.ndim))
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
