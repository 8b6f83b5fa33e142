"""`gc.data.RayDataLoader`: a ``gc.data.DataLoader`` over a ``ray.data.Dataset``, whose rows never
gather on the driver.

    loader = gc.data.RayDataLoader(ray.data.read_parquet("s3://..."), batch_size=64, seed=0)
    trainer.fit(loader, epochs=5)          # gc.Trainer(..., workers=N) too

The dataset is run once, in order (Ray Data's ``preserve_order``), into Ray's object store (which
spills to disk), each block numbered with its rows' places (``__row``). Epoch ``e`` serves the rows
in the order a ``DataLoader`` with the same settings serves the same rows: the permutation of
``numpy.random.default_rng((seed, e))``, applied by Ray Data's ``sort`` on each row's place in it
(no shuffle: in the dataset's order), read in batches by ``iter_batches``. So any batch of any epoch
is served again from the settings alone, and a checkpoint resumes mid-epoch exactly, as with a
``DataLoader``. A reader of only some rows of each batch (a data-parallel worker's shard) or some
columns (the driver's labels) runs a pipeline of those alone, filtered before the sort.
"""

from __future__ import annotations

import hashlib
from collections.abc import Collection, Iterator, Sequence
from typing import Any, Optional

import numpy as np

from graphc.model.dtypes import TensorSpec
from graphc.runtime.data import check_arrays, check_whole

__all__ = ["RayDataLoader"]

ROW, PLACE = "__row", "__place"  # the row's place in the dataset, and in the epoch's order


def _numbered(table: Any, first: int) -> Any:
    """``table`` (a block) with the column ``ROW``: ``first, first + 1, ...``."""
    import pyarrow

    return table.append_column(ROW, pyarrow.array(np.arange(first, first + table.num_rows, dtype=np.int64)))


def _rows(table: Any) -> int:
    return table.num_rows


class _Placed:
    """A ``map_batches`` function: each row's place in epoch ``epoch``'s order (``PLACE``)."""

    def __init__(self, seed: Optional[int], epoch: int, rows: int):
        self.order = (seed, epoch, rows)

    def __call__(self, batch: dict) -> dict:
        seed, epoch, rows = self.order
        where = batch[ROW]
        if seed is not None:
            where = np.argsort(np.random.default_rng((seed, epoch)).permutation(rows))[where]
        batch[PLACE] = where
        return batch


class _Kept:
    """A ``filter`` predicate: rows at places ``[first, end)`` whose place in their batch (of ``size``)
    lies in ``[lo, hi)``."""

    def __init__(self, first: int, end: int, size: int, lo: int, hi: int):
        self.bounds = (first, end, size, lo, hi)

    def __call__(self, row: dict) -> bool:
        first, end, size, lo, hi = self.bounds
        place = int(row[PLACE])
        return first <= place < end and lo <= place % size < hi


class RayDataLoader:
    """Iterate dicts of batches (numpy arrays by column name) from ``dataset`` as a ``DataLoader``
    would from the same rows as arrays: the same options, batches and per-epoch order.

    Args:
        dataset: a ``ray.data.Dataset``; each column an input of the model (more are left out of
            nothing, as a ``DataLoader``'s arrays: a batch holds them all).
        batch_size, shuffle, drop_last, seed: as ``gc.data.DataLoader``'s.
    """

    def __init__(self, dataset: Any, batch_size: int, shuffle: bool = True, drop_last: bool = False, seed: int = 0):
        import ray.data

        if not isinstance(dataset, ray.data.Dataset):
            raise TypeError(f"RayDataLoader takes a ray.data.Dataset, got {type(dataset).__name__}; "
                            "for a dict of arrays use gc.data.DataLoader")
        for name, value, least in (("batch_size", batch_size, 1), ("seed", seed, 0)):
            check_whole(name, value, least)
        self.dataset = dataset
        self.batch_size, self.shuffle, self.drop_last, self.seed = int(batch_size), bool(shuffle), bool(drop_last), \
            int(seed)
        self.epoch = 0  # the epoch the next plain ``iter(loader)`` runs
        self._blocks: Optional[list] = None  # the numbered blocks in Ray's object store (``_store``)
        self._counts: list[int] = []
        self._reading: dict = {}  # columns -> (key, next batch index, iterator): the stream read in order
        self._arrays: Optional[dict[str, np.ndarray]] = None
        self._digest = ""

    def __getstate__(self) -> dict:
        """What a data-parallel worker gets: the stored blocks (refs), not a stream being read."""
        self._store()
        return {**self.__dict__, "_reading": {}}

    # -- the stored rows ----------------------------------------------------------------------------
    def _store(self) -> list:
        """Run the dataset once, in order, into numbered blocks in the object store (not here)."""
        if self._blocks is None:
            import ray

            self.dataset.context.execution_options.preserve_order = True
            refs = self.dataset.to_arrow_refs()
            self._counts = ray.get([ray.remote(_rows).remote(r) for r in refs])
            firsts = np.cumsum([0, *self._counts])[:-1]
            self._blocks = [ray.remote(_numbered).remote(r, int(f)) for r, f in zip(refs, firsts)]
        return self._blocks

    @property
    def num_samples(self) -> int:
        self._store()
        return int(sum(self._counts))

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """Each column as a stand-in array (its dtype and row shape, ``num_samples`` rows, no data):
        what ``check_against`` checks and a data-parallel driver's batches stand in for."""
        if self._arrays is None:
            import ray.data

            first = ray.data.from_arrow_refs(self._store()).take_batch(1, batch_format="numpy")
            self._arrays = {name: np.broadcast_to(np.zeros((), a.dtype), (self.num_samples, *a.shape[1:]))
                            for name, a in first.items() if name != ROW}
        return self._arrays

    def fingerprint(self) -> str:
        """A digest of the columns' names, dtypes, shapes and up to 64 rows, evenly spaced (as
        ``DataLoader.fingerprint``'s), read once."""
        if not self._digest:
            import ray.data

            n = self.num_samples
            rows = set(np.unique(np.linspace(0, max(n - 1, 0), min(n, 64)).astype(np.int64)).tolist())
            picked = ray.data.from_arrow_refs(self._store()).filter(lambda row: row[ROW] in rows)
            picked.context.execution_options.preserve_order = True
            got = picked.take_batch(len(rows), batch_format="numpy") if rows else {}
            h = hashlib.sha256()
            for name in sorted(self.arrays):
                a = self.arrays[name]
                h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
                h.update(np.ascontiguousarray(got.get(name, a[:0])).tobytes())
            self._digest = h.hexdigest()[:16]
        return self._digest

    def __len__(self) -> int:
        """Batches per epoch."""
        if self.drop_last:
            return self.num_samples // self.batch_size
        return -(-self.num_samples // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The dataset's rows of ``epoch`` in the order they are served (``DataLoader.order``)."""
        if not self.shuffle:
            return np.arange(self.num_samples)
        return np.random.default_rng((self.seed, int(epoch))).permutation(self.num_samples)

    def sample(self, epoch: int, index: int, row: int) -> int:
        """The dataset's row that is row ``row`` of batch ``index`` of ``epoch``."""
        return int(self.order(epoch)[index * self.batch_size + row])

    # -- reading ------------------------------------------------------------------------------------
    def _stream(self, epoch: int, start: int, lo: int, hi: int, columns: Optional[tuple[str, ...]],
                full_only: bool) -> Iterator[dict[str, np.ndarray]]:
        """Rows ``lo:hi`` of batches ``start, start + 1, ...`` of ``epoch`` (of the full batches only,
        with ``full_only``), in order, one dict a batch."""
        import ray.data

        size, n = self.batch_size, self.num_samples
        end = len(self) * size if not full_only else n // size * size
        ds = ray.data.from_arrow_refs(self._store())
        if columns is not None:
            ds = ds.select_columns([*columns, ROW])
        ds = ds.map_batches(_Placed(self.seed if self.shuffle else None, epoch, n), batch_format="numpy")
        ds = ds.filter(_Kept(start * size, min(end, n), size, lo, hi))
        if self.shuffle:
            ds = ds.sort(PLACE)
        ds.context.execution_options.preserve_order = True
        for batch in ds.iter_batches(batch_size=hi - lo, batch_format="numpy"):
            yield {name: a for name, a in batch.items() if name not in (ROW, PLACE)}

    def iter_epoch(self, epoch: int, start: int = 0) -> Iterator[dict[str, np.ndarray]]:
        """Batches ``start, start+1, ...`` of ``epoch`` (a resumed epoch starts mid-way)."""
        if not 0 <= start <= len(self):
            raise ValueError(f"start batch {start} is outside epoch of {len(self)} batches")
        if start == len(self):
            return iter(())
        return self._stream(epoch, start, 0, self.batch_size, None, full_only=False)

    def __iter__(self) -> Iterator[dict[str, np.ndarray]]:
        epoch = self.epoch
        self.epoch += 1
        return self.iter_epoch(epoch)

    def batch(self, epoch: int, index: int, rows: slice = slice(None),
              columns: Optional[tuple[str, ...]] = None) -> dict[str, np.ndarray]:
        """Batch ``index`` of ``epoch``, or only its ``rows`` (a data-parallel worker's shard) or
        ``columns``: read on from the stream of the last call where it goes on from there (a worker
        reads its shards in order), else from a stream started at ``index``."""
        size = min(self.batch_size, self.num_samples - index * self.batch_size)
        lo, hi, _ = rows.indices(size)
        hi = max(hi, lo)
        if hi == lo:
            return {name: np.zeros((0, *a.shape[1:]), a.dtype) for name, a in self.arrays.items()
                    if columns is None or name in columns}
        whole = (lo, hi) == (0, size)
        if not whole and size < self.batch_size:  # a last partial batch's part: read alone
            return next(self._stream(epoch, index, lo, hi, columns, full_only=False))
        key = (epoch, 0, self.batch_size) if whole else (epoch, lo, hi)
        held = self._reading.get(columns)
        if held is None or held[0] != key or not held[1] <= index:
            held = [key, index, self._stream(epoch, index, *key[1:], columns, full_only=not whole)]
            self._reading[columns] = held
        for _ in range(index - held[1]):
            next(held[2])
        held[1] = index + 1
        return next(held[2])

    def column(self, epoch: int, index: int, name: str) -> np.ndarray:
        """Column ``name`` of batch ``index`` of ``epoch`` alone (a data-parallel driver reads the
        labels so, the workers the rest)."""
        return self.batch(epoch, index, columns=(name,))[name]

    def check_against(self, specs: Sequence[TensorSpec], labels: Collection[str] = ()) -> None:
        """``DataLoader.check_against`` on the columns' dtypes and row shapes."""
        check_arrays(specs, self.arrays, self, labels)
