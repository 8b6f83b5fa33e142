"""Functions that read a float dtype's limits (eps, tiny, max) take bfloat16 as torch does: numpy's
``finfo`` refuses ml_dtypes' bfloat16, ``graphc.model.dtypes.finfo`` does not. Values against torch
in bfloat16 on the numpy backend (onnxruntime's CPU kernels have no bfloat16 Log, Mul or Where)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc.model.dtypes import finfo, to_numpy

torch = pytest.importorskip("torch")

P = np.array([[0.1, 0.5, 0.9], [0.3, 0.25, 0.7]], np.float32)


@pytest.mark.parametrize("name", ["float16", "bfloat16", "float32", "float64"])
def test_finfo_is_torchs(name):
    want, got = torch.finfo(getattr(torch, name)), finfo(name)
    assert (float(got.eps), float(got.tiny), float(got.max), float(got.min)) == (want.eps, want.tiny, want.max,
                                                                                 want.min)


def _bf16(a: np.ndarray) -> np.ndarray:
    return a.astype(to_numpy("bfloat16"))


CASES = [
    ("nan_to_num", lambda M, x: M.nan_to_num(x), np.array([1.5, np.nan, np.inf, -np.inf], np.float32)),
    ("rms_norm", lambda M, x: (torch.nn.functional if M is torch else F).rms_norm(x, [3]), P),
    ("bernoulli_log_prob", lambda M, x: M.distributions.Bernoulli(probs=x).log_prob(x * 0 + 1), P),
    ("categorical_entropy", lambda M, x: M.distributions.Categorical(probs=x).entropy(), P),
    ("geometric_log_prob", lambda M, x: M.distributions.Geometric(probs=x).log_prob(x * 0 + 2), P),
]


@pytest.mark.parametrize("name,fn,x", CASES, ids=[c[0] for c in CASES])
def test_bfloat16_matches_torch(name, fn, x):
    x = _bf16(x)
    want = fn(torch, torch.from_numpy(x.astype(np.float32)).to(torch.bfloat16)).float().numpy()
    model = gc.capture(lambda x: fn(gc, x), x=x)
    onnx.checker.check_model(model.proto, full_check=True)
    got = gc.Session(model, backend="numpy").run({"x": x})["output"]
    assert got.dtype == to_numpy("bfloat16")
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=2e-2, atol=1e-2)

