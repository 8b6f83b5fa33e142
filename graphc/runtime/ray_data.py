"""`gc.data.RayDataLoader`: a ``gc.data.DataLoader`` over a ``ray.data.Dataset``, whose rows never
gather on the driver.

    loader = gc.data.RayDataLoader(ray.data.read_parquet("s3://..."), batch_size=64, seed=0)
    trainer.fit(loader, epochs=5)          # gc.Trainer(..., workers=N) too

The dataset is run once, in order (Ray Data's ``preserve_order``), into Ray's object store (which
spills to disk); the reader keeps the blocks' refs, row counts and columns (``ray_columns``).
Epoch ``e`` serves the rows in the order a ``DataLoader`` with the same settings serves the same
rows (the permutation of ``numpy.random.default_rng((seed, e))``; no shuffle: the dataset's
order), so any batch of any epoch is served again from the settings alone and a checkpoint
resumes mid-epoch exactly.

The reader knows the block and offset of each row it serves; Ray tasks move the rows. The epoch is
cut into chunks of whole batches, about a block's rows each: a block whose rows go to several
chunks is split by one task (in a shuffled epoch, every block: a map-reduce shuffle, as Ray Data's
``sort`` does, less its sampling pass), and one task per chunk joins its rows in order, ``AHEAD``
chunks ahead of the one being read. A reader of only some rows of each batch (a data-parallel
worker's shard) or some columns (the driver's labels) moves those alone.
"""

from __future__ import annotations

import functools
import hashlib
import weakref
from collections import deque
from contextlib import closing
from collections.abc import Collection, Iterator, Sequence
from typing import Any, Callable, Optional

import numpy as np

from graphc.model.dtypes import TensorSpec
from graphc.runtime.data import check_arrays, check_whole
from graphc.runtime.ray_columns import Column, Columns, arrays, block_layout, checked
from graphc.runtime import ray_waits

__all__ = ["RayDataLoader"]

AHEAD = 2  # chunks joined ahead of the one being read
LATE_BLOCK = ("the loader's tasks ask for no CPU, so the object store (spilling to disk, full) or a node holding the "
              "block (slow, lost) kept the rows from the task")


def _split(columns: Columns, layout: dict[str, Column], table: Any,
           *offsets: np.ndarray) -> tuple[dict[str, np.ndarray], ...]:
    """The rows at each of ``offsets`` of block ``table``: what it gives each chunk it feeds."""
    got = arrays(table, columns, layout)
    return tuple({name: a[at] for name, a in got.items()} for at in offsets)


def _joined(order: Optional[np.ndarray], columns: Columns, layout: dict[str, Column],
            offsets: Sequence[Optional[np.ndarray]], *parts: Any) -> dict[str, np.ndarray]:
    """A chunk's rows: each of ``parts`` (a stored block's rows at its ``offsets``, or a part of a
    split block: offsets None) in turn, then put in ``order`` (None: as they are)."""
    pieces = [p if at is None else {name: a[at] for name, a in arrays(p, columns, layout).items()}
              for p, at in zip(parts, offsets)]
    whole = {name: np.concatenate([p[name] for p in pieces]) for name in pieces[0]}
    return whole if order is None else {name: a[order] for name, a in whole.items()}


@functools.cache
def _task(fn: Callable) -> Any:
    """``fn`` as a Ray task (made once a process) that asks for no CPU: it moves rows and computes
    nothing, and data-parallel workers may hold every CPU of the cluster (``workers=N`` of one CPU
    on N CPUs; of 0.5 spread over 1-CPU nodes), where a task of one CPU (Ray's default) waited for
    ever, and the reader with it."""
    import ray

    return ray.remote(num_cpus=0)(fn)


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
        self._blocks: Optional[list] = None  # the blocks' refs in Ray's object store (``_store``)
        self._firsts = np.zeros(0, np.int64)  # each block's first row
        self._columns: dict[str, Column] = {}  # each column's dtype and row shape (``ray_columns.checked``)
        self._reading: dict = {}  # columns -> (key, next batch index, stream): the stream ``batch`` reads on
        self._open: weakref.WeakSet = weakref.WeakSet()  # the streams not yet read to their end (``close``)
        self._arrays: Optional[dict[str, np.ndarray]] = None
        self._digest = ""

    def __getstate__(self) -> dict:
        """What a data-parallel worker gets: the stored blocks (refs), not the streams being read."""
        self._store()
        return {**self.__dict__, "_reading": {}, "_open": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state, _open=weakref.WeakSet())

    # -- the stored rows ----------------------------------------------------------------------------
    def _store(self) -> list:
        """Run the dataset once, in order, into blocks in the object store (not here), and check
        its blocks' columns into one dtype and row shape each (``ray_columns``)."""
        if self._blocks is None:
            self.dataset.context.execution_options.preserve_order = True
            refs = ray_waits.ran(self.dataset.to_arrow_refs, "the dataset's run into the object store (its first use)")
            layouts = ray_waits.got([_task(block_layout).remote(r) for r in refs],
                                    f"reading the layout of the dataset's {len(refs)} block(s)", LATE_BLOCK)
            firsts = np.cumsum([0, *(count for count, _ in layouts)], dtype=np.int64)
            self._columns = checked(layouts, firsts)
            self._firsts, self._blocks = firsts, refs
        return self._blocks

    @property
    def stored(self) -> bool:
        """Whether the dataset was run into the object store (its first use did)."""
        return self._blocks is not None

    @property
    def num_samples(self) -> int:
        self._store()
        return int(self._firsts[-1])

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """Each column as a stand-in array (its dtype and row shape, ``num_samples`` rows, no data):
        what ``check_against`` checks and a data-parallel driver's batches stand in for."""
        if self._arrays is None:
            self._store()
            self._arrays = {name: np.broadcast_to(np.zeros((), c.dtype), (self.num_samples, *c.shape))
                            for name, c in self._columns.items()}
        return self._arrays

    def fingerprint(self) -> str:
        """A digest of the columns' names, dtypes, shapes and up to 64 rows, evenly spaced (as
        ``DataLoader.fingerprint``'s, equal over the same rows), read once."""
        if not self._digest:
            n = self.num_samples
            rows = np.unique(np.linspace(0, max(n - 1, 0), min(n, 64)).astype(np.int64))
            got = next(self._read(rows, np.array([0, len(rows)]), None)) if len(rows) else {}
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
    def _read(self, rows: np.ndarray, cuts: np.ndarray, columns: Columns) -> Iterator[dict[str, np.ndarray]]:
        """The dataset's ``rows`` (their numbers), in that order: one dict of arrays a chunk, chunk
        ``k`` being ``rows[cuts[k]:cuts[k + 1]]``."""
        blocks, chunks = self._store(), len(cuts) - 1
        block = np.searchsorted(self._firsts, rows, side="right") - 1
        offset = rows - self._firsts[block]
        key = (np.searchsorted(cuts, np.arange(len(rows)), side="right") - 1) * len(blocks) + block  # chunk, block
        by = np.argsort(key, kind="stable")
        keys, starts = np.unique(key[by], return_index=True)
        fed: list[list[tuple[int, np.ndarray]]] = [[] for _ in range(chunks)]  # (block, places), in block order
        feeds: dict[int, list[tuple[int, np.ndarray]]] = {}  # block -> (chunk, places), the chunks it feeds
        for both, places in zip(keys.tolist(), np.split(by, starts[1:])):
            c, j = divmod(both, len(blocks))
            fed[c].append((j, places))
            feeds.setdefault(j, []).append((c, places))
        split: dict[tuple[int, int], Any] = {}  # (chunk, block) -> the part of a split block for the chunk

        def join(k: int) -> Any:
            parts, offsets = [], []
            for j, places in fed[k]:
                whole = len(feeds[j]) == 1
                if not whole and (k, j) not in split:
                    refs = _task(_split).options(num_returns=len(feeds[j])).remote(
                        columns, self._columns, blocks[j], *(offset[p] for _, p in feeds[j]))
                    split.update({(c, j): ref for (c, _), ref in zip(feeds[j], refs)})
                parts.append(blocks[j] if whole else split.pop((k, j)))
                offsets.append(offset[places] if whole else None)
            at = np.concatenate([p for _, p in fed[k]])
            order = None if np.all(at[1:] > at[:-1]) else np.argsort(at)
            return _task(_joined).remote(order, columns, self._columns, offsets, *parts)

        pending = deque(join(k) for k in range(min(chunks, AHEAD + 1)))
        for k in range(chunks):
            if k + AHEAD + 1 < chunks:
                pending.append(join(k + AHEAD + 1))
            yield ray_waits.got(pending.popleft(), f"reading chunk {k} of {chunks} (rows of the stored blocks)",
                                LATE_BLOCK)

    def _stream(self, epoch: int, start: int, lo: int, hi: int, columns: Columns,
                full_only: bool) -> Iterator[dict[str, np.ndarray]]:
        """Rows ``lo:hi`` of batches ``start, start + 1, ...`` of ``epoch`` (of the full batches only,
        with ``full_only``), in order, one dict a batch; in ``_open`` for ``close``."""
        size, n = self.batch_size, self.num_samples
        end = n // size * size if full_only else min(len(self) * size, n)
        places = np.arange(start * size, end)
        places = places[(lo <= places % size) & (places % size < hi)]
        counts = np.bincount(places // size - start, minlength=-(-end // size) - start)
        per = max(1, round(n / max(len(self._blocks), 1) / max(hi - lo, 1)))  # batches a chunk: about a block's rows
        ends = np.cumsum(counts)
        cuts = np.array([0, *ends[per - 1::per], *([ends[-1]] if len(ends) % per else [])], np.int64)
        stream = self._batches(self._read(self.order(epoch)[places], cuts, columns), counts, per)
        self._open.add(stream)
        return stream

    @staticmethod
    def _batches(chunks: Iterator[dict[str, np.ndarray]], counts: np.ndarray,
                 per: int) -> Iterator[dict[str, np.ndarray]]:
        """``chunks`` cut into batches of ``counts`` rows, ``per`` batches a chunk: writable copies, as a
        ``DataLoader``'s (the object store's arrays are read-only, and let go once copied)."""
        for first, chunk in zip(range(0, len(counts), per), chunks):
            bounds = np.cumsum(counts[first:first + per])[:-1]
            for parts in zip(*(np.split(np.array(a), bounds) for a in chunk.values())):
                yield dict(zip(chunk, parts))

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
              columns: Columns = None) -> dict[str, np.ndarray]:
        """Batch ``index`` of ``epoch``, or only its ``rows`` (a data-parallel worker's shard) or
        ``columns``: read on from the stream of the last call where it goes on from there (a worker
        reads its shards in order; the stream is closed once its last batch is read), else from a
        stream started at ``index``."""
        size = min(self.batch_size, self.num_samples - index * self.batch_size)
        lo, hi, _ = rows.indices(size)
        hi = max(hi, lo)
        if hi == lo:
            return {name: np.zeros((0, *a.shape[1:]), a.dtype) for name, a in self.arrays.items()
                    if columns is None or name in columns}
        whole = (lo, hi) == (0, size)
        if not whole and size < self.batch_size:  # a last partial batch's part: read alone
            stream = self._stream(epoch, index, lo, hi, columns, full_only=False)
            with closing(stream):
                return next(stream)
        key = (epoch, 0, self.batch_size) if whole else (epoch, lo, hi)
        held = self._reading.get(columns)
        if held is None or held[0] != key or not held[1] <= index:
            if held is not None:
                held[2].close()
            held = [key, index, self._stream(epoch, index, *key[1:], columns, full_only=not whole)]
            self._reading[columns] = held
        for _ in range(index - held[1]):
            next(held[2])
        held[1] = index + 1
        got = next(held[2])
        if held[1] == (len(self) if whole else self.num_samples // self.batch_size):
            held[2].close()
            del self._reading[columns]
        return got

    def close(self) -> None:
        """Stop reading every stream not read to its end (its chunks in flight and in the object store
        are let go); ``fit`` does at its end. A later read starts a stream again."""
        for stream in list(self._open):
            stream.close()
        self._open.clear()
        self._reading.clear()

    def column(self, epoch: int, index: int, name: str) -> np.ndarray:
        """Column ``name`` of batch ``index`` of ``epoch`` alone (a data-parallel driver reads the
        labels so, the workers the rest)."""
        return self.batch(epoch, index, columns=(name,))[name]

    def check_against(self, specs: Sequence[TensorSpec], labels: Collection[str] = (),
                      complex_inputs: Collection[str] = ()) -> None:
        """``DataLoader.check_against`` on the columns' dtypes and row shapes."""
        check_arrays(specs, self.arrays, self, labels, complex_inputs)
