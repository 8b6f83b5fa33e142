"""`gc.data.DataLoader`: batches of named arrays, shuffled per epoch, prefetched on a thread.

    loader = gc.data.DataLoader({"x": x, "y": y}, batch_size=64, seed=0)
    for batch in loader:          # one epoch per iteration; batch == {"x": ..., "y": ...}
        trainer.step(batch)

Shuffling is deterministic: epoch ``e`` uses the permutation drawn from
``numpy.random.default_rng((seed, e))``, so any epoch (and any batch inside it) can be replayed
without replaying the ones before it; this is what lets a checkpoint resume mid-epoch exactly.
"""

from __future__ import annotations

import hashlib
import numbers
import queue
import threading
from contextlib import contextmanager
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from typing import Any, Optional

import numpy as np

from graphc.errors import InputError
from graphc.model.complex_io import complex_spec
from graphc.model.dtypes import TensorSpec, type_text
from graphc.runtime.feeds import dtype_name

__all__ = ["DataLoader", "RayDataLoader"]

_DONE = object()


class _Failure:
    """A producer-side exception, carried through the queue to be re-raised by the consumer."""

    def __init__(self, exc: BaseException):
        self.exc = exc


def check_whole(name: str, value: Any, least: int, meaning: str = "") -> None:
    """``ValueError`` unless ``value`` is a whole number (not a bool) of at least ``least``;
    ``meaning`` follows the bound in the message (``" (the epoch to train to)"``)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"{name} must be a whole number >= {least}{meaning}, got {value!r}")


class DataLoader:
    """Iterate dicts of batches from ``arrays`` (all sharing their first dimension).

    Args:
        arrays: name -> array; every array has the same length along axis 0.
        batch_size: samples per batch (the last batch may be smaller unless ``drop_last``).
        shuffle: draw a fresh permutation each epoch (deterministic from ``seed`` and the epoch).
        drop_last: skip the final partial batch.
        seed: seed of the per-epoch permutations.
        prefetch: batches assembled ahead on a background thread (0: no thread).
    """

    def __init__(self, arrays: Mapping[str, np.ndarray], batch_size: int, shuffle: bool = True,
                 drop_last: bool = False, seed: int = 0, prefetch: int = 2):
        if not isinstance(arrays, Mapping):
            raise TypeError(f"DataLoader takes a dict of arrays (input name -> array), got {type(arrays).__name__}")
        if not arrays:
            raise ValueError("DataLoader needs at least one array")
        for name, value, least in (("batch_size", batch_size, 1), ("prefetch", prefetch, 0), ("seed", seed, 0)):
            check_whole(name, value, least)
        self.arrays = {name: np.asarray(a) for name, a in arrays.items()}
        lengths = {name: (a.shape[0] if a.ndim else None) for name, a in self.arrays.items()}
        if None in lengths.values() or len(set(lengths.values())) != 1:
            raise ValueError(f"every array needs the same length along axis 0; got {lengths}")
        self.num_samples = next(iter(lengths.values()))
        self.batch_size = int(batch_size)
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.seed = int(seed)
        self.prefetch = int(prefetch)
        self.epoch = 0  # the epoch the next plain ``iter(loader)`` runs

    def fingerprint(self) -> str:
        """A digest of the arrays' names, dtypes, shapes and up to 64 of their rows, evenly spaced:
        what tells a resumed run's data from other data of the same length, cheaply at any size."""
        h = hashlib.sha256()
        rows = np.unique(np.linspace(0, max(self.num_samples - 1, 0), min(self.num_samples, 64)).astype(np.int64))
        for name in sorted(self.arrays):
            a = self.arrays[name]
            h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
            h.update(np.ascontiguousarray(a[rows]).tobytes())
        return h.hexdigest()[:16]

    def __len__(self) -> int:
        """Batches per epoch."""
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    # -- order ---------------------------------------------------------------------------------
    def order(self, epoch: int) -> np.ndarray:
        """Sample indices of ``epoch`` in the order they are served (read-only; the last epoch's
        is kept, so reading an epoch batch by batch draws its permutation once)."""
        if not self.shuffle:
            return np.arange(self.num_samples)
        cached = self.__dict__.get("_order")
        if cached is None or cached[0] != int(epoch):
            order = np.random.default_rng((self.seed, int(epoch))).permutation(self.num_samples)
            order.setflags(write=False)
            cached = self._order = (int(epoch), order)
        return cached[1]

    def sample(self, epoch: int, index: int, row: int) -> int:
        """The data's row that is row ``row`` of batch ``index`` of ``epoch``."""
        return int(self.order(epoch)[index * self.batch_size + row])

    def batch(self, epoch: int, index: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
        """Batch ``index`` of ``epoch`` (what iteration yields at that position), or only its
        ``rows`` (a data-parallel worker's shard)."""
        return self._gather(self.order(epoch), index, rows)

    def column(self, epoch: int, index: int, name: str) -> np.ndarray:
        """Array ``name`` of batch ``index`` of ``epoch`` alone (a data-parallel driver reads the
        labels so, the workers the rest)."""
        return np.ascontiguousarray(self.arrays[name][self._span(self.order(epoch), index, slice(None))])

    def _span(self, order: np.ndarray, index: int, rows: slice) -> slice | np.ndarray:
        """Where ``rows`` of batch ``index`` lie in the arrays: a slice, or indices when shuffled."""
        start = index * self.batch_size
        lo, hi, _ = rows.indices(min(self.batch_size, self.num_samples - start))
        lo, hi = start + lo, start + max(hi, lo)
        return slice(lo, hi) if not self.shuffle else order[lo:hi]

    def _gather(self, order: np.ndarray, index: int, rows: slice = slice(None)) -> dict[str, np.ndarray]:
        span = self._span(order, index, rows)
        if isinstance(span, slice):
            return {name: np.ascontiguousarray(a[span]) for name, a in self.arrays.items()}
        return {name: a[span] for name, a in self.arrays.items()}

    # -- iteration -----------------------------------------------------------------------------
    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        epoch = self.epoch
        self.epoch += 1
        return self.iter_epoch(epoch)

    def iter_epoch(self, epoch: int, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Batches ``start, start+1, ...`` of ``epoch`` (a resumed epoch starts mid-way)."""
        if not 0 <= start <= len(self):
            raise ValueError(f"start batch {start} is outside epoch of {len(self)} batches")
        indices = range(start, len(self))
        if self.prefetch == 0:
            order = self.order(epoch)
            return (self._gather(order, i) for i in indices)
        return self._prefetched(epoch, indices)

    def _prefetched(self, epoch: int, indices: Sequence[int]) -> Iterator[dict[str, np.ndarray]]:
        q: queue.Queue = queue.Queue(maxsize=self.prefetch)
        stop = threading.Event()

        def put(item: Any) -> bool:
            while not stop.is_set():
                try:
                    q.put(item, timeout=0.05)
                    return True
                except queue.Full:
                    continue
            return False

        def produce() -> None:
            try:
                order = self.order(epoch)
                for i in indices:
                    if not put(self._gather(order, i)):
                        return
                put(_DONE)
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                put(_Failure(exc))

        thread = threading.Thread(target=produce, name="graphc-dataloader", daemon=True)
        thread.start()
        try:
            while True:
                item = q.get()
                if item is _DONE:
                    return
                if isinstance(item, _Failure):
                    raise item.exc
                yield item
        finally:
            # Consumer finished, broke out early or raised: stop the producer and reap it.
            stop.set()
            while thread.is_alive():
                try:
                    q.get_nowait()
                except queue.Empty:
                    pass
                thread.join(timeout=0.05)

    # -- checks --------------------------------------------------------------------------------
    def check_against(self, specs: Sequence[TensorSpec], labels: Collection[str] = (),
                      complex_inputs: Collection[str] = ()) -> None:
        """Raise ``gc.InputError`` unless every spec has an array with its dtype and shape.

        ``specs`` are a model's batched inputs: dim 0 is the batch dim (any size when symbolic;
        a fixed batch dim must equal ``batch_size`` and every batch must be full). ``labels``:
        int64 class-label inputs that take uint8 arrays too (the Trainer casts each batch's).
        ``complex_inputs``: the ``[..., 2]`` real pair inputs that take a complex array too
        (``graphc.model.complex_io``; the Trainer makes each batch's its pair).
        """
        check_arrays(specs, self.arrays, self, labels, complex_inputs)


def check_arrays(specs: Sequence[TensorSpec], arrays: Mapping[str, np.ndarray], loader: Any,
                 labels: Collection[str] = (), complex_inputs: Collection[str] = ()) -> None:
    """``DataLoader.check_against`` on ``arrays`` (a ``RayDataLoader``'s are stand-ins of its columns)."""
    for spec in specs:
        if spec.name not in arrays:
            raise InputError(
                f"the data has no array {spec.name!r} for the model input {spec}; "
                f"arrays given: {', '.join(sorted(arrays))}")
        array = arrays[spec.name]
        held = complex_spec(spec) if spec.name in complex_inputs and np.iscomplexobj(array) else spec
        _check_array(held, array, loader, spec.name in labels)


def replays(loader: Any) -> bool:
    """Whether ``loader`` is a ``DataLoader`` or a ``gc.data.RayDataLoader``: both serve any batch of
    any epoch again from their settings (without importing Ray: where ``ray_data`` is not loaded,
    ``loader`` cannot be a ``RayDataLoader``)."""
    import sys

    module = sys.modules.get("graphc.runtime.ray_data")
    return isinstance(loader, DataLoader) or (module is not None and isinstance(loader, module.RayDataLoader))


@contextmanager
def streams_closed(*loaders: Any) -> Iterator[None]:
    """A ``with`` block after which (raised or not) each ``gc.data.RayDataLoader`` among ``loaders``
    has closed the streams it held open (``fit``'s: a stream read part way holds its chunks in Ray's
    object store until it is collected)."""
    try:
        yield
    finally:
        for loader in loaders:
            if replays(loader) and not isinstance(loader, DataLoader):
                loader.close()


def __getattr__(name: str) -> Any:
    if name == "RayDataLoader":  # API: gc.data.RayDataLoader, imported once asked for
        from graphc.runtime.ray_data import RayDataLoader

        return RayDataLoader
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def check_training_loader(loader: Any) -> None:
    """``TypeError`` unless ``loader`` is a ``DataLoader`` or a ``RayDataLoader``: a checkpoint records
    its settings and a resumed run replays its order from them, mid-epoch, which no other iterable allows."""
    if not replays(loader):
        raise TypeError("fit trains from a gc.data.DataLoader (a checkpoint records its settings, and a resumed run "
                        "replays its batches from them, from the middle of an epoch on, which a list, a generator or a "
                        f"torch DataLoader cannot do); got {_kind(loader)}: make one from the arrays, "
                        "gc.data.DataLoader({'x': x, 'y': y}, batch_size=64), or from a ray.data.Dataset, "
                        "gc.data.RayDataLoader(dataset, batch_size=64)")


def check_eval_loader(loader: Any, passes: int = 1) -> None:
    """``TypeError`` unless ``loader`` is what an evaluation reads (``eval_batches``) and gives
    its batches ``passes`` times (an iterator gives them once)."""
    if replays(loader):
        return
    if isinstance(loader, Mapping):
        raise TypeError("the eval loader is a dict, one batch: give an iterable of batch dicts (a list of them, a "
                        "gc.data.DataLoader), or evaluate the batch with Trainer.evaluate(batch)")
    if not isinstance(loader, Iterable):
        raise TypeError("the eval loader must be a gc.data.DataLoader or an iterable of batch dicts; "
                        f"got {_kind(loader)}")
    if passes > 1 and iter(loader) is loader:
        raise TypeError(f"the eval loader is a one-shot iterator ({_kind(loader)}) that gives its batches once, and "
                        f"fit evaluates after each of {passes} epochs: pass a list of batch dicts or a "
                        "gc.data.DataLoader")


def eval_batches(loader: Any) -> Iterator[Mapping[str, Any]]:
    """The batches an evaluation reads from ``loader``: a ``DataLoader``'s (epoch 0), or any other
    iterable's dicts of arrays by input name (a list of them, a generator, a torch DataLoader whose
    dataset gives dicts); ``TypeError`` for one that is not a dict, ``ValueError`` for none at all."""
    if replays(loader):
        yield from loader.iter_epoch(0)
        return
    check_eval_loader(loader)
    count = 0
    for count, batch in enumerate(loader, start=1):
        if not isinstance(batch, Mapping):
            raise TypeError(f"batch {count} of the eval loader is {_kind(batch)}, not a dict of arrays by input name "
                            "(a torch DataLoader gives dicts when its dataset's items are dicts)")
        yield batch
    if not count:
        spent = iter(loader) is loader
        raise ValueError("the eval loader gives no batch" + (" (an iterator gives its batches once, and this one is "
                                                             "used up)" if spent else ""))


def first_non_finite(batch: Mapping[str, Any]) -> Optional[tuple[str, tuple[int, ...], float]]:
    """(name, index, value) of the first NaN or infinity in ``batch``'s float arrays, in the
    batch's order; None where every value is finite."""
    for name, value in batch.items():
        array = np.asarray(value)
        if array.dtype.kind == "f" and array.size:
            bad = ~np.isfinite(array)
            if bad.any():
                at = tuple(int(i) for i in np.argwhere(bad)[0])
                return name, at, float(array[at])
    return None


def _kind(value: Any) -> str:
    """The type of ``value`` as a message names it: ``list``, ``torch.utils.data.dataloader.DataLoader``."""
    kind = type(value)
    return kind.__qualname__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__qualname__}"


def _check_array(spec: TensorSpec, array: np.ndarray, loader: Any, label: bool = False) -> None:
    got = type_text(array.dtype, array.shape)
    if dtype_name(array.dtype) != spec.dtype and not (label and array.dtype == np.uint8):
        raise InputError(f"array {spec.name!r}: expected dtype {spec.dtype} (model input {spec}), "
                         f"got {got}; cast it with .astype")
    if spec.shape is None:
        return
    if array.ndim != len(spec.shape):
        raise InputError(f"array {spec.name!r}: expected rank {len(spec.shape)} (model input {spec}; "
                         f"axis 0 is the batch), got {got}")
    for axis, (want, have) in enumerate(zip(spec.shape, array.shape)):
        if not isinstance(want, int):
            continue
        if axis == 0:
            ragged = not loader.drop_last and loader.num_samples % loader.batch_size
            if want != loader.batch_size or ragged:
                raise InputError(
                    f"array {spec.name!r}: the model input {spec} has a fixed batch size {want}; "
                    f"the loader gives batches of {loader.batch_size}"
                    f"{' with a smaller last batch (use drop_last=True)' if ragged else ''}")
        elif want != have:
            raise InputError(f"array {spec.name!r}: expected size {want} on axis {axis} "
                             f"(model input {spec}), got {got}")
