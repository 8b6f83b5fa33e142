"""An index that is each row's own position (``passes/training/row_positions.py``) mixes no rows:
flex_attention's document mask ``ids[b, q_idx] == ids[b, kv_idx]`` (``b`` a Range over the symbolic batch)
and torch's per-row pick ``logits[arange(N), labels]`` give no ``gc.DataParallelWarning`` for 2 workers, the
batch's dim name kept through the GatherND so a later Reshape is not flagged either; on numpy and ort-cpu the
document-masked attention of the whole batch equals that of its two shards, and torch's. A shifted or
flipped position, or a label as the batch index, still mixes."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from graphc.nn import functional as F
from graphc.nn.attention.flex_attention import create_block_mask, flex_attention
from test_row_mixing import _found, _mse

RNG = np.random.default_rng(0)
DOCS = np.array([[0, 0, 1, 1, 1, 2], [0, 1, 1, 1, 2, 2], [0, 0, 0, 1, 1, 1], [0, 1, 2, 3, 4, 5]])


def _document_attention(x, ids, index, lib=gc, flex=flex_attention, block_mask=create_block_mask):
    """Self-attention of x [B, H, L, E] within the documents ``ids`` [B, L] names, ``index(ids, b, q)``
    reading a query's document; flattened to [B, H L E]."""
    def document(b, h, q_idx, kv_idx):
        return index(ids, b, q_idx) == index(ids, b, kv_idx)
    kw = {} if lib is gc else {"device": "cpu"}
    mask = block_mask(document, x.shape[0], None, x.shape[2], x.shape[2], **kw)
    return flex(x, x, x, block_mask=mask).reshape(x.shape[0], -1)


def _own(ids, b, q):
    return ids[b, q]


class _Documents(nn.Module):
    def __init__(self, index):
        super().__init__()
        self.fc, self.index = nn.Linear(4, 4), index

    def forward(self, x, ids):
        return {"out": _document_attention(self.fc(x), ids, self.index)}


def _documents_found(index) -> list[str]:
    model = gc.capture(_Documents(index), seed=0, x=gc.spec("float32", ("B", 2, 6, 4)),
                       ids=gc.spec("int64", ("B", 6)))
    return _found(_mse(model, "out"))


def test_a_document_mask_indexing_ids_by_the_batch_position_mixes_no_rows():
    assert _documents_found(_own) == []


@pytest.mark.parametrize("index", [
    lambda ids, b, q: ids[(b + 1) % ids.shape[0], q],  # the next row's documents
    lambda ids, b, q: ids[gc.flip(b, [0]), q],
    lambda ids, b, q: ids[b * 0, q],  # the first row's
])
def test_a_document_mask_reading_another_rows_ids_mixes(index):
    assert [f.split()[0] for f in _documents_found(index)][:1] == ["GatherND"]


def test_the_document_mask_on_two_shards_is_the_whole_batchs_and_torchs():
    """float64 on numpy and ort-cpu: the batch of 4 at once, as two shards of 2, and torch 2.13's flex_attention."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention import flex_attention as tflex
    x = RNG.standard_normal((4, 2, 6, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's eager flex_attention asks for torch.compile
        want = _document_attention(torch.from_numpy(x), torch.from_numpy(DOCS), _own, torch, tflex.flex_attention,
                                   tflex.create_block_mask).numpy()
    model = gc.capture(lambda x, ids: _document_attention(x, ids, _own), x=gc.spec("float64", ("B", 2, 6, 3)),
                       ids=gc.spec("int64", ("B", 6)))
    for backend in ("numpy", "ort-cpu"):
        session = gc.Session(model, backend=backend)
        whole = session.run({"x": x, "ids": DOCS})["output"]
        shards = np.concatenate([session.run({"x": x[s], "ids": DOCS[s]})["output"] for s in (slice(2), slice(2, 4))])
        np.testing.assert_allclose(whole, want, rtol=1e-12, atol=1e-14, err_msg=backend)
        np.testing.assert_array_equal(shards, whole, err_msg=backend)


class _Picks(nn.Module):
    """log-probabilities [N, 3] of x [N, 6], picked per row by ``pick(logp, positions, y)``."""

    def __init__(self, pick):
        super().__init__()
        self.fc, self.pick = nn.Linear(6, 3), pick

    def forward(self, x, y):
        logp = F.log_softmax(self.fc(x), -1)
        return {"out": self.pick(logp, gc.arange(x.shape[0]), y).reshape(x.shape[0], -1)}


PICKS = {
    "label": (lambda p, n, y: p[n, y], []),  # torch's logits[torch.arange(B), targets]
    "column_grid": (lambda p, n, y: p[n[:, None], gc.zeros_like(p).long()], []),
    "rows": (lambda p, n, y: p[n], []),
    "flipped": (lambda p, n, y: p[gc.flip(n, [0]), y], ["GatherND"]),
    "shifted": (lambda p, n, y: p[(n + 1) % p.shape[0], y], ["GatherND"]),
    "label_as_row": (lambda p, n, y: p[y, n % 3], ["GatherND"]),
    "flattened": (lambda p, n, y: p.reshape(-1)[n], ["Gather"]),  # the first N of the N * 3 values: not row i's
    "flat_index": (lambda p, n, y: p.reshape(-1)[n * 3 + y], []),  # row i's block of 3, torch.onnx's flat index
    "flat_stride_2": (lambda p, n, y: p.reshape(-1)[n * 2 + y], ["Gather"]),
    "halved": (lambda p, n, y: p[n // 2, y], ["GatherND"]),
}


@pytest.mark.parametrize("kind", list(PICKS))
def test_a_per_row_pick_by_the_batch_position(kind):
    pick, found = PICKS[kind]
    model = gc.capture(_Picks(pick), seed=0, x=gc.spec("float32", ("N", 6)), y=gc.spec("int64", ("N",)))
    assert [f.split()[0] for f in _found(_mse(model, "out"))][:1] == found
