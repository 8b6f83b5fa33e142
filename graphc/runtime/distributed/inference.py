"""``gc.distributed.map_batches``: batch inference with a ``gc.Session`` per Ray worker.

    out = gc.distributed.map_batches("model.onnx", {"x": x}, batch_size=256, workers=4)
    ds = gc.distributed.map_batches(model, ray.data.read_parquet(...))   # a Dataset in, one out

A ``ray.data.Dataset`` goes through Ray Data's ``map_batches`` with an actor pool of
``workers`` sessions (lazy, streamed; row order as Ray Data's ``preserve_order`` says). A dict
of arrays is cut into ``batch_size`` rows (the inputs by rows; others go whole with each), the
batches are dealt to ``workers`` session actors and the outputs come back concatenated in input
order.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from graphc.errors import GraphError, InputError
from graphc.model import complex_io
from graphc.runtime.distributed.cluster import check_resources, connect, get
from graphc.runtime.distributed.mixed_rows import warn_mixed_batches
from graphc.runtime.rows import batch_dim, by_rows, time_major
from graphc.runtime.feeds import optional_inputs, validate_feeds

__all__ = ["map_batches"]


class SessionRunner:
    """A ``gc.Session`` of the model (serialized bytes, or an object ref of them) on one worker,
    made by the first call (so a backend that cannot run there fails a call, with its reason,
    rather than the actor's start)."""

    def __init__(self, model: Any, backend: str, options: Mapping[str, Any]):
        self._args = (model, backend, dict(options))
        self._session = None

    def backend(self) -> str:
        if self._session is None:
            import ray

            from graphc.runtime.session import Session

            model, backend, options = self._args
            if isinstance(model, ray.ObjectRef):
                model = ray.get(model)
            if backend != "numpy":
                options.setdefault("threads", 1)
            self._session = Session(model, backend=backend, **options)
            self._inputs = [s.name for s in self._session.inputs]
        return self._session.backend

    def __call__(self, batch: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.backend()
        return self._session.run({n: batch[n] for n in self._inputs if n in batch})


def _is_dataset(data: Any) -> bool:
    """Whether ``data`` is a ``ray.data.Dataset``, without importing Ray Data (pandas, pyarrow)
    when it is not loaded: then ``data`` cannot be one."""
    import sys

    module = sys.modules.get("ray.data")
    return module is not None and isinstance(data, module.Dataset)


def map_batches(model_or_path: Any, data: Any, backend: str = "auto", batch_size: int = 256,
                workers: Optional[int] = None, *, ray_address: Optional[str] = None, num_cpus: float = 1.0,
                num_gpus: float = 0.0, timeout_s: float = 600.0, **options: Any):
    """Run the model over ``data`` on Ray workers, each with its own ``gc.Session``.

    Args:
        model_or_path: a ``gc.Model``, an ``.onnx`` path, its bytes or a ``ModelProto``.
        data: a ``ray.data.Dataset`` (returns one, lazily) or a dict of arrays with the same
            number of rows (returns a dict of outputs, rows in input order). An input whose
            first dim is not the batch's (``rows.batch_dim``) goes whole with every batch.
        backend, options: for each worker's ``gc.Session`` (``ort-cuda`` with ``num_gpus``).
        batch_size: rows per session run.
        workers: how many sessions; default the cluster's CPUs / ``num_cpus``.

    Raises:
        gc.BackendUnavailable: the backend cannot run on a worker with these resources (the
            reason, e.g. no GPU in the cluster); never a fallback to another backend.
        gc.InputError: ``data`` is not what ``gc.Session`` takes (an unknown or missing input, a
            dtype or shape it does not match), or its arrays differ in rows: checked before any
            worker starts. Arrays of 0 rows give outputs of 0 rows, as ``gc.Session``.
        gc.GraphError: an output is not by rows (a scalar, say): batches' outputs cannot be joined; a
            recurrent layer runs over the rows (a time-major model): batches would cut its sequences.
    """
    from graphc.model import load

    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an int >= 1, got {batch_size!r}")
    loaded = load(model_or_path)
    dim = batch_dim(loaded.inputs)
    cut = time_major(loaded.ir.graph, dim)
    if cut is not None:
        raise GraphError(f"map_batches: {cut}")
    whole = [str(s) for s in loaded.outputs if not by_rows(s, dim)]
    if whole:
        raise GraphError(f"map_batches: output(s) {'; '.join(whole)} do not start with the batch dim {dim!r} of the "
                         "inputs, so the batches' outputs cannot be joined by rows; run gc.Session on the whole data")
    dataset = _is_dataset(data)
    split = {s.name for s in loaded.inputs if by_rows(s, dim, computed=True)}
    if not dataset:  # checked whole, as one gc.Session would, before any worker starts
        if not isinstance(data, Mapping):
            raise TypeError(f"map_batches takes a ray.data.Dataset or a dict of arrays, got {type(data).__name__}")
        # complex inputs as Session.run takes them (the pairs go to the workers, whose Sessions give complex outputs)
        complex_inputs, _ = complex_io.complex_names(loaded.ir.metadata_props)
        arrays = validate_feeds(loaded.inputs, complex_io.pairs_of(loaded.inputs, complex_inputs, data),
                                optional_inputs(loaded))
        split = {n for n in split if n in arrays}
        rows = {n: (arrays[n].shape[0] if arrays[n].ndim else None) for n in split}
        if len(set(rows.values())) != 1 or None in rows.values():
            raise InputError(f"map_batches: every input whose first dim is {dim!r} needs the same number of rows; "
                             f"got {rows}")
    if dataset or next(iter(rows.values())) > batch_size:  # more than one batch
        warn_mixed_batches(loaded, split)
    ray = connect(ray_address, "gc.distributed.map_batches")
    if workers is None:
        workers = max(1, int(ray.cluster_resources().get("CPU", 1.0) // max(num_cpus, 1e-9)))
    if not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    check_resources(ray, workers, num_cpus, num_gpus, timeout_s)
    model = ray.put(loaded.proto.SerializeToString())
    resources = {"num_cpus": num_cpus, "num_gpus": num_gpus}
    actor = ray.remote(SessionRunner).options(**resources, max_restarts=0)
    if dataset:
        probe = actor.remote(model, backend, options)  # fail now, with the reason, not when ``data`` is read
        try:
            get(ray, [probe.backend.remote()], timeout_s, "starting a session on a worker")
        finally:
            ray.kill(probe)
        return data.map_batches(SessionRunner, fn_constructor_args=(model, backend, options), batch_size=batch_size,
                                batch_format="numpy", concurrency=workers, **resources)
    total = next(iter(rows.values()))
    starts = range(0, total, batch_size) or [0]  # no rows: one empty batch, whose outputs have 0 rows as a Session's
    runners = [actor.remote(model, backend, options) for _ in range(min(workers, len(starts)))]
    try:  # the sessions stop whatever happens: a failed or late batch left them holding their CPUs
        get(ray, [r.backend.remote() for r in runners], timeout_s, "starting the sessions")
        refs = [runners[i % len(runners)].__call__.remote({n: a[lo:lo + batch_size] if n in split else a
                                                           for n, a in arrays.items()})
                for i, lo in enumerate(starts)]
        who = [f"batch {i} (rows {lo}:{min(lo + batch_size, total)})" for i, lo in enumerate(starts)]
        parts = get(ray, refs, timeout_s, "batch inference", who)
    finally:
        for runner in runners:
            ray.kill(runner)
    return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
