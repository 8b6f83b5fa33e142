"""``gc.autocast("cpu")`` op by op against torch 2.13's ``torch.autocast("cpu", dtype=torch.bfloat16)``:
for each op of ``autocast_policy.POLICY``'s CPU column that graphc has, the output dtype is torch's
under autocast and the values agree to bfloat16's precision, on the numpy and ort-cpu backends; the
table's CPU column is what torch does; the casts are cached and float64 is left alone."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import graphc as gc
import graphc.nn.functional as F
from graphc.dsl import autocast_policy
from graphc.model.dtypes import as_dtype

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

RNG = np.random.default_rng(0)


def _f(M):
    return torch.nn.functional if M is torch else F


def _labels(n, classes):
    return lambda r: r.integers(0, classes, (n,))


def _n(*shape):
    return lambda r: r.standard_normal(shape).astype(np.float32)


def _p(*shape):
    return lambda r: r.uniform(0.05, 0.95, shape).astype(np.float32)


# op -> (fn(M, *inputs), input makers); M is torch or graphc
CASES = {
    "matmul": (lambda M, a, b: M.matmul(a, b), [_n(3, 4, 5), _n(5, 6)]),
    "mm": (lambda M, a, b: M.mm(a, b), [_n(4, 5), _n(5, 6)]),
    "bmm": (lambda M, a, b: M.bmm(a, b), [_n(2, 4, 5), _n(2, 5, 3)]),
    "baddbmm": (lambda M, c, a, b: M.baddbmm(c, a, b), [_n(2, 4, 3), _n(2, 4, 5), _n(2, 5, 3)]),
    "addmm": (lambda M, c, a, b: M.addmm(c, a, b), [_n(4, 3), _n(4, 5), _n(5, 3)]),
    "addbmm": (lambda M, c, a, b: M.addbmm(c, a, b), [_n(4, 3), _n(2, 4, 5), _n(2, 5, 3)]),
    "linear": (lambda M, x, w, b: _f(M).linear(x, w, b), [_n(2, 3, 5), _n(4, 5), _n(4)]),
    "conv1d": (lambda M, x, w: _f(M).conv1d(x, w, padding=1), [_n(2, 3, 9), _n(4, 3, 3)]),
    "conv2d": (lambda M, x, w, b: _f(M).conv2d(x, w, b), [_n(2, 3, 6, 6), _n(4, 3, 3, 3), _n(4)]),
    "conv3d": (lambda M, x, w: _f(M).conv3d(x, w), [_n(1, 2, 4, 4, 4), _n(3, 2, 2, 2, 2)]),
    "conv_transpose1d": (lambda M, x, w: _f(M).conv_transpose1d(x, w, stride=2), [_n(2, 3, 5), _n(3, 2, 3)]),
    "conv_transpose2d": (lambda M, x, w: _f(M).conv_transpose2d(x, w), [_n(1, 3, 4, 4), _n(3, 2, 3, 3)]),
    "conv_transpose3d": (lambda M, x, w: _f(M).conv_transpose3d(x, w), [_n(1, 2, 3, 3, 3), _n(2, 2, 2, 2, 2)]),
    "conv_tbc": (lambda M, x, w, b: M.conv_tbc(x, w, b, 1), [_n(7, 2, 3), _n(3, 3, 4), _n(4)]),
    "prelu": (lambda M, x, w: _f(M).prelu(x, w), [_n(2, 3, 4), _n(3)]),
    "scaled_dot_product_attention": (lambda M, q, k, v: _f(M).scaled_dot_product_attention(q, k, v),
                                     [_n(2, 3, 5, 8), _n(2, 3, 6, 8), _n(2, 3, 6, 8)]),
    "cat": (lambda M, a, b: M.cat([M.matmul(a, a), b]), [_n(3, 3), _n(2, 3)]),
    "stack": (lambda M, a, b: M.stack([M.matmul(a, a), b]), [_n(3, 3), _n(3, 3)]),
    "index_copy": (lambda M, a, b: a.index_copy(0, M.tensor([2, 0]) if M is torch else gc.tensor(np.array([2, 0])),
                                                M.matmul(b, b)), [_n(4, 2), _n(2, 2)]),
    "mse_loss": (lambda M, a, b: _f(M).mse_loss(M.matmul(a, b), a), [_n(4, 4), _n(4, 4)]),
    "l1_loss": (lambda M, a, b: _f(M).l1_loss(M.matmul(a, b), a), [_n(4, 4), _n(4, 4)]),
    "smooth_l1_loss": (lambda M, a, b: _f(M).smooth_l1_loss(M.matmul(a, b), a), [_n(4, 4), _n(4, 4)]),
    "huber_loss": (lambda M, a, b: _f(M).huber_loss(M.matmul(a, b), a), [_n(4, 4), _n(4, 4)]),
    "cross_entropy": (lambda M, a, b, y: _f(M).cross_entropy(M.matmul(a, b), y), [_n(4, 5), _n(5, 3), _labels(4, 3)]),
    "nll_loss": (lambda M, a, y: _f(M).nll_loss(_f(M).log_softmax(a, 1), y), [_n(4, 3), _labels(4, 3)]),
    "kl_div": (lambda M, a, b: _f(M).kl_div(M.matmul(a, b), b, reduction="batchmean"), [_n(4, 4), _p(4, 4)]),
    "binary_cross_entropy": (lambda M, p, y: _f(M).binary_cross_entropy(p, y), [_p(4, 3), _p(4, 3)]),
    "binary_cross_entropy_with_logits": (lambda M, a, b, y: _f(M).binary_cross_entropy_with_logits(M.matmul(a, b), y),
                                         [_n(4, 4), _n(4, 3), _p(4, 3)]),
    "poisson_nll_loss": (lambda M, a, b: _f(M).poisson_nll_loss(M.matmul(a, b), b.abs()), [_n(4, 4), _n(4, 4)]),
    "cosine_embedding_loss": (lambda M, a, b, y: _f(M).cosine_embedding_loss(M.matmul(a, b), b, y.sign()),
                              [_n(4, 4), _n(4, 4), _n(4)]),
    "hinge_embedding_loss": (lambda M, a, b, y: _f(M).hinge_embedding_loss(M.matmul(a, b), y.sign()),
                             [_n(4, 4), _n(4, 4), _n(4, 4)]),
    "margin_ranking_loss": (lambda M, a, b, y: _f(M).margin_ranking_loss(M.matmul(a, b)[0], b[0], y.sign()),
                            [_n(4, 4), _n(4, 4), _n(4)]),
    "soft_margin_loss": (lambda M, a, b, y: _f(M).soft_margin_loss(M.matmul(a, b), y.sign()),
                         [_n(4, 4), _n(4, 4), _n(4, 4)]),
    "multilabel_margin_loss": (lambda M, a, b, y: _f(M).multilabel_margin_loss(M.matmul(a, b), y),
                               [_n(4, 4), _n(4, 3), lambda r: np.array([[0, 2, -1], [1, -1, 0], [2, 1, 0], [-1, 0, 0]])]),
    "multi_margin_loss": (lambda M, a, b, y: _f(M).multi_margin_loss(M.matmul(a, b), y), [_n(4, 4), _n(4, 3), _labels(4, 3)]),
    "triplet_margin_loss": (lambda M, a, b, c: _f(M).triplet_margin_loss(M.matmul(a, b), b, c), [_n(4, 4), _n(4, 4), _n(4, 4)]),
    "cdist": (lambda M, a, b: M.cdist(M.matmul(a, b), b), [_n(4, 4), _n(4, 4)]),
    "prod": (lambda M, a, b: M.prod(M.matmul(a, b), 1), [_n(4, 4), _n(4, 4)]),
    "trace": (lambda M, a, b: M.trace(M.matmul(a, b)), [_n(4, 4), _n(4, 4)]),
    "inverse": (lambda M, a: M.inverse(M.matmul(a, a) + 4 * (M.eye(4) if M is torch else gc.eye(4))), [_n(4, 4)]),
    "layer_norm": (lambda M, a, b, w: _f(M).layer_norm(M.matmul(a, b), (4,), w, w), [_n(3, 4), _n(4, 4), _n(4)]),
    "group_norm": (lambda M, a, w: _f(M).group_norm(_f(M).conv2d(a, a[:4]), 2, w[:4], w[:4]),
                   [_n(4, 4, 3, 3), _n(4)]),
    "batch_norm": (lambda M, a, w: _f(M).batch_norm(_f(M).conv2d(a, a[:4]), w[:4] * 0, w[:4].abs() + 1, w[:4], w[:4],
                                                    training=True), [_n(4, 4, 3, 3), _n(4)]),
}

def _u(*shape):
    return lambda r: r.uniform(-0.9, 0.9, shape).astype(np.float32)


def _eye(n, scale=2.0):
    return lambda r: (scale * np.eye(n)).astype(np.float32)


def _spd(M, a, d):
    """A bfloat16 (under autocast) symmetric positive definite ``a a^T + d d`` (``d`` is 2I)."""
    return M.matmul(a, a.T) + M.matmul(d, d)


def _window(M):
    return M.hann_window(16)


def _conv(M, nd, x, w):
    return getattr(_f(M), f"conv{nd}d")(x, w)


# the CPU float32 ops beyond the losses (each fed a bfloat16 value where a lowered op can make one)
_X2, _W2, _X3, _W3, _X1, _W1 = _n(1, 2, 7, 7), _n(2, 2, 2, 2), _n(1, 2, 5, 5, 5), _n(2, 2, 2, 2, 2), _n(1, 2, 7), _n(2, 2, 2)
_SPD = [_n(4, 4), _eye(4)]
CASES.update({
    "avg_pool3d": (lambda M, x, w: _f(M).avg_pool3d(_conv(M, 3, x, w), 2), [_X3, _W3]),
    "max_pool3d": (lambda M, x, w: _f(M).max_pool3d(_conv(M, 3, x, w), 2), [_X3, _W3]),
    "adaptive_avg_pool3d": (lambda M, x, w: _f(M).adaptive_avg_pool3d(_conv(M, 3, x, w), 2), [_X3, _W3]),
    "adaptive_max_pool3d": (lambda M, x, w: _f(M).adaptive_max_pool3d(_conv(M, 3, x, w), 2), [_X3, _W3]),
    "max_unpool2d": (lambda M, x, w: _f(M).max_unpool2d(*_f(M).max_pool2d(_conv(M, 2, x, w), 2, return_indices=True), 2),
                     [_X2, _W2]),
    "max_unpool3d": (lambda M, x, w: _f(M).max_unpool3d(*_f(M).max_pool3d(_conv(M, 3, x, w), 2, return_indices=True), 2),
                     [_X3, _W3]),
    "fractional_max_pool2d": (lambda M, x, w, s: _f(M).fractional_max_pool2d(_conv(M, 2, x, w), 2, output_size=3,
                                                                            _random_samples=s), [_X2, _W2, _p(1, 2, 2)]),
    "fractional_max_pool3d": (lambda M, x, w, s: _f(M).fractional_max_pool3d(_conv(M, 3, x, w), 2, output_size=2,
                                                                            _random_samples=s), [_X3, _W3, _p(1, 2, 3)]),
    "grid_sample": (lambda M, x, w, g: _f(M).grid_sample(_conv(M, 2, x, w), g, align_corners=False),
                    [_X2, _W2, _u(1, 3, 3, 2)]),
    "grid_sampler": (lambda M, x, w, g: M.grid_sampler(_conv(M, 2, x, w), g, 0, 0, False), [_X2, _W2, _u(1, 3, 3, 2)]),
    # given: torch's kernel runs on what it is given where graphc's is built from lowered ops
    "convolution": (lambda M, x, w: M.convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1), [_X2, _W2]),
    "_upsample_bilinear2d_aa": (lambda M, x: _f(M).interpolate(x, scale_factor=0.5, mode="bilinear", antialias=True),
                                [_X2]),
    "_upsample_bicubic2d_aa": (lambda M, x: _f(M).interpolate(x, scale_factor=0.5, mode="bicubic", antialias=True),
                               [_X2]),
    "reflection_pad1d": (lambda M, x, w: _f(M).pad(_conv(M, 1, x, w), (2, 1), mode="reflect"), [_X1, _W1]),
    "reflection_pad2d": (lambda M, x, w: _f(M).pad(_conv(M, 2, x, w), (2, 1, 1, 2), mode="reflect"), [_X2, _W2]),
    "replication_pad1d": (lambda M, x, w: _f(M).pad(_conv(M, 1, x, w), (2, 1), mode="replicate"), [_X1, _W1]),
    "replication_pad2d": (lambda M, x, w: _f(M).pad(_conv(M, 2, x, w), (2, 1, 1, 2), mode="replicate"), [_X2, _W2]),
    "replication_pad3d": (lambda M, x, w: _f(M).pad(_conv(M, 3, x, w), (1, 1, 2, 1, 1, 2), mode="replicate"),
                          [_X3, _W3]),
    "quantile": (lambda M, a, b: M.quantile(M.matmul(a, b), 0.3, dim=1), [_n(4, 5), _n(5, 5)]),
    "nanquantile": (lambda M, a, b: M.nanquantile(M.matmul(a, b), 0.7, dim=0), [_n(4, 5), _n(5, 5)]),
    "stft": (lambda M, a, b: M.stft(M.matmul(a, b), 16, window=_window(M), return_complex=False), [_n(64, 4), _n(4)]),
    "fake_quantize_per_tensor_affine": (lambda M, a, b: M.fake_quantize_per_tensor_affine(M.matmul(a, b), 0.1, 0, -128, 127),
                                        [_n(4, 4), _n(4, 4)]),
    "ctc_loss": (lambda M, a, b, y: _f(M).ctc_loss(_f(M).log_softmax(M.matmul(a, b), 2), y, (6, 6), (2, 2)),
                 [_n(6, 2, 5), _n(5, 4), lambda r: r.integers(1, 4, (2, 2))]),
    "cholesky": (lambda M, a, d: M.linalg.cholesky(_spd(M, a, d)), _SPD),
    "linalg_cholesky_ex": (lambda M, a, d: M.linalg.cholesky_ex(_spd(M, a, d)).L, _SPD),
    "cholesky_solve": (lambda M, a, d, b: M.cholesky_solve(M.matmul(b, d[:2, :2]), M.tril(_spd(M, a, d))),
                       [*_SPD, _n(4, 2)]),
    "cholesky_inverse": (lambda M, a, d: M.cholesky_inverse(M.tril(_spd(M, a, d))), _SPD),
    "pinverse": (lambda M, a, d: M.pinverse(_spd(M, a, d)), _SPD),
    "geqrf": (lambda M, a, d: M.geqrf(_spd(M, a, d))[0], _SPD),
    "orgqr": (lambda M, a, d, t: M.orgqr(M.matmul(a, d), t), [*_SPD, _p(4)]),
    "ormqr": (lambda M, a, d, t, b: M.ormqr(M.matmul(a, d), t, M.matmul(b, d[:2, :2])), [*_SPD, _p(4), _n(4, 2)]),
    "linalg_qr": (lambda M, a, d: M.linalg.qr(_spd(M, a, d)).R, _SPD),
    "linalg_svd": (lambda M, a, d: M.linalg.svd(_spd(M, a, d)).S, _SPD),
    "linalg_svdvals": (lambda M, a, d: M.linalg.svdvals(_spd(M, a, d)), _SPD),
    "linalg_eigh": (lambda M, a, d: M.linalg.eigh(_spd(M, a, d)).eigenvalues, _SPD),
    "linalg_eigvalsh": (lambda M, a, d: M.linalg.eigvalsh(_spd(M, a, d)), _SPD),
    "linalg_inv": (lambda M, a, d: M.linalg.inv(_spd(M, a, d)), _SPD),
    "linalg_inv_ex": (lambda M, a, d: M.linalg.inv_ex(_spd(M, a, d)).inverse, _SPD),
    "linalg_solve": (lambda M, a, d, b: M.linalg.solve(_spd(M, a, d), M.matmul(b, d[:2, :2])), [*_SPD, _n(4, 2)]),
    "linalg_lstsq": (lambda M, a, d, b: M.linalg.lstsq(M.matmul(a, d), M.matmul(b, d[:2, :2])).solution,
                     [_n(6, 4), _eye(4), _n(6, 2)]),
    "linalg_cond": (lambda M, a, d: M.linalg.cond(_spd(M, a, d)), _SPD),
    "linalg_matrix_rank": (lambda M, a, d: M.linalg.matrix_rank(_spd(M, a, d)), _SPD),
    "linalg_tensorinv": (lambda M, a, d: M.linalg.tensorinv(_spd(M, a, d).reshape(2, 2, 4), ind=2), _SPD),
    "linalg_tensorsolve": (lambda M, a, d, b: M.linalg.tensorsolve(_spd(M, a, d).reshape(2, 2, 2, 2),
                                                                    M.matmul(b, d[:2, :2])), [*_SPD, _n(2, 2)]),
    "triangular_solve": (lambda M, a, d, b: M.triangular_solve(M.matmul(b, d[:2, :2]), M.tril(_spd(M, a, d)),
                                                               upper=False).solution, [*_SPD, _n(4, 2)]),
    "linalg_vecdot": (lambda M, a, b: M.linalg.vecdot(a, b), [_n(3, 5), _n(3, 5)]),
    "tensordot": (lambda M, a, b: M.tensordot(a, b, dims=1), [_n(4, 4), _n(4, 2)]),  # torch's CPU kernel: mm
})


def _spectrum(op):
    """``op`` (the real part of a complex output) of a bfloat16 product under autocast, which a float32 op
    casts; of the float32 input itself for an op torch's CPU list leaves out (its kernel refuses bfloat16)."""
    def fn(M, a, b):
        x = a if autocast_policy.kind(op, "cpu") == autocast_policy.GIVEN else M.matmul(a, b)
        out = getattr(M.fft, op.removeprefix("fft_"))(x)
        return out.real if out.is_complex() else out
    return fn


# the transforms torch's CPU autocast lists run in float32; the others (hfft2, hfftn, ihfft2, ihfftn) as given
FFTS = [f"fft_{op}" for op in ("fft", "ifft", "fft2", "ifft2", "fftn", "ifftn", "rfft", "irfft", "rfft2", "irfft2",
                                "rfftn", "irfftn", "hfft", "ihfft", "hfft2", "hfftn", "ihfft2", "ihfftn")]
CASES.update({op: (_spectrum(op), [_n(4, 6), _n(6, 8)]) for op in FFTS})
CASES.update({
    "polar": (lambda M, a, b: M.polar(M.matmul(a, b).abs(), b[0]).real, [_n(3, 4), _n(4, 4)]),
    "view_as_complex": (lambda M, a, b: M.view_as_complex(M.matmul(a, b)).imag, [_n(3, 4), _n(4, 2)]),
})
CPU_OPS = sorted(op for op, (cpu, _) in autocast_policy.POLICY.items() if cpu is not None)


def _arrays(op):
    return [make(RNG) for make in CASES[op][1]]


def _torch(op, arrays):
    ts = [torch.from_numpy(a) for a in arrays]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return CASES[op][0](torch, *ts)


def _capture(op, arrays, **autocast):
    names = [f"x{i}" for i in range(len(arrays))]

    def fn(**kw):
        with gc.autocast("cpu", **autocast):
            return CASES[op][0](gc, *(kw[n] for n in names))

    return gc.capture(fn, **{n: gc.spec(as_dtype(a.dtype), a.shape) for n, a in zip(names, arrays)})


def test_every_cpu_op_has_a_case():
    assert sorted(CASES) == CPU_OPS


@pytest.mark.parametrize("op", CPU_OPS)
def test_dtype_and_values_are_torchs(op):
    arrays = _arrays(op)
    want = _torch(op, arrays)
    model = _capture(op, arrays)
    feeds = {f"x{i}": a for i, a in enumerate(arrays)}
    exact = want.float().detach().numpy()
    scale = max(1.0, float(np.abs(exact).max()))
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run(feeds)["output"]
        assert str(as_dtype(got.dtype)) == str(want.dtype).removeprefix("torch."), (op, backend, got.dtype)
        np.testing.assert_allclose(got.astype(np.float32), exact, rtol=3e-2, atol=3e-2 * scale, err_msg=f"{op} {backend}")


@pytest.mark.parametrize("op", CPU_OPS)
def test_policy_cpu_column_is_torchs(op):
    """The table's CPU column against torch itself: ``lower`` ops of float32 give bfloat16, ``fp32``
    ops of bfloat16 give float32, ``promote`` ops of bfloat16 and float32 give float32 (the cases'
    own mixes), ``mixed`` norms keep bfloat16 beside float32 params."""
    kind = autocast_policy.kind(op, "cpu")
    arrays = _arrays(op)
    if kind == autocast_policy.GIVEN:  # not cast: torch's kernel runs on bfloat16 as given, or refuses it
        try:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                out = CASES[op][0](torch, *[torch.from_numpy(a).bfloat16() for a in arrays])
        except RuntimeError as exc:
            assert "BFloat16" in str(exc), op
        else:
            assert out.dtype == torch.bfloat16, op
    elif kind == autocast_policy.FP32:
        ts = [torch.from_numpy(a) for a in arrays]
        ts = [t.bfloat16() if t.is_floating_point() else t for t in ts]
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out = CASES[op][0](torch, *ts)
        assert out.dtype == (torch.float32 if out.is_floating_point() else torch.int64), op  # matrix_rank: int64
    else:
        assert _torch(op, arrays).dtype == (torch.bfloat16 if kind in (autocast_policy.LOWER, autocast_policy.MIXED)
                                            else torch.float32), op


def test_casts_are_cached_and_float64_left_alone():
    def fn(x, y):
        with gc.autocast("cpu"):
            return gc.matmul(x, x) + gc.matmul(x, x.T), gc.matmul(y, y)

    model = gc.capture(fn, x=gc.spec("float32", (3, 3)), y=gc.spec("float64", (3, 3)))
    casts = [n for n in model.ir.graph if n.op_type == "Cast"]
    # x to bfloat16 once (read by both products), x.T once, the sum's bfloat16 operands: none (same dtype)
    assert [n.inputs[0].name for n in casts].count("x") == 1
    assert len(casts) == 2
    assert [str(as_dtype(int(o.dtype))) for o in model.ir.graph.outputs] == ["bfloat16", "float64"]


@pytest.mark.parametrize("op", ["matmul", "conv2d", "linalg_vecdot", "grid_sample", "cholesky", "replication_pad2d",
                                "cross_entropy", "cat"])
def test_cpu_float16_autocast_is_torchs(op):
    """``gc.autocast("cpu", "float16")`` against ``torch.autocast("cpu", dtype=torch.float16)``."""
    arrays = _arrays(op)
    with torch.autocast("cpu", dtype=torch.float16):
        want = CASES[op][0](torch, *[torch.from_numpy(a) for a in arrays])
    model = _capture(op, arrays, dtype="float16")
    feeds = {f"x{i}": a for i, a in enumerate(arrays)}
    exact = want.float().detach().numpy()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run(feeds)["output"]
        assert str(as_dtype(got.dtype)) == str(want.dtype).removeprefix("torch."), (op, backend)
        np.testing.assert_allclose(got.astype(np.float32), exact, rtol=5e-3, atol=5e-3 * max(1.0, np.abs(exact).max()))


@pytest.mark.parametrize("fn", [
    lambda M, x: _f(M).max_pool3d(x, 2, return_indices=True)[0],  # max_pool3d_with_indices: not listed
    lambda M, x: M.fake_quantize_per_tensor_affine(x, M.tensor(0.1), M.tensor(0, dtype=M.int32), -128, 127),
    lambda M, x: _f(M).pad(x, (1, 1, 1, 1, 1, 1), mode="reflect"),  # reflection_pad3d: not listed
])
def test_the_forms_torch_leaves_alone_stay_narrow(fn):
    """A bfloat16 input to an op's overload that torch's CPU list leaves out stays bfloat16."""
    a = RNG.standard_normal((1, 2, 4, 4, 4)).astype(np.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fn(torch, torch.from_numpy(a).bfloat16()).dtype == torch.bfloat16

    def captured(x):
        with gc.autocast("cpu"):
            return fn(gc, gc.cast(x, "bfloat16"))

    assert [str(as_dtype(int(o.dtype))) for o in gc.capture(captured, x=gc.spec("float32", a.shape)).ir.graph.outputs] \
        == ["bfloat16"]


def test_cuda_column_float32_and_lower_ops():
    """A few of the CUDA column's float32 ops (``**`` too) and ``linalg.multi_dot`` (lowered) on
    float16 inputs under ``gc.autocast("cuda")``; the CPU policy leaves the float32 ones alone."""

    def fn(x):
        h = gc.cast(x, "float16")
        return (h ** 2, gc.tan(h), gc.sum(h), gc.nn.functional.softplus(h), gc.nn.functional.normalize(h),
                gc.linalg.multi_dot([x, x, x]))

    def dtypes(device):
        with gc.autocast(device):
            model = gc.capture(fn, x=gc.spec("float32", (3, 3)))
        return [str(as_dtype(int(o.dtype))) for o in model.ir.graph.outputs]

    assert dtypes("cuda") == ["float32"] * 5 + ["float16"]
    assert dtypes("cpu") == ["float16"] * 5 + ["bfloat16"]


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_fourier_transforms_are_not_lowered(device):
    """``gc.fft``'s transforms are MatMuls with a cos/sin basis: under ``gc.autocast`` they run in float32 (CPU:
    torch's list; CUDA: as given) with no Cast, equal to torch's float32 transform to float32's precision. They
    ran in the low dtype before (bfloat16 outputs 2.4e-2 off an rfft whose values reach 8.2)."""
    x = RNG.standard_normal((4, 6)).astype(np.float32)
    for op in FFTS:
        fn = getattr(gc.fft, op.removeprefix("fft_"))

        def captured(x):
            with gc.autocast(device):
                out = fn(x)
            return gc.view_as_real(out) if out.is_complex() else out

        model = gc.capture(captured, x=gc.spec("float32", x.shape))
        assert {n.op_type for n in model.ir.graph}.isdisjoint({"Cast"}), op
        want = getattr(torch.fft, op.removeprefix("fft_"))(torch.from_numpy(x))
        want = (torch.view_as_real(want.resolve_conj()) if want.is_complex() else want).numpy()
        for backend in ("numpy", "ort-cpu"):
            got = gc.Session(model, backend=backend).run({"x": x})["output"]
            assert got.dtype == np.float32, (op, backend)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.abs(want).max(), err_msg=f"{op} {backend}")


def _bilinear(M, a, c, w, *bias):
    return _f(M).bilinear(a, c, w, *bias)


# torch's CPU einsum: a pair summing a shared index of size > 1 is a bmm (lowered), another a mul (promoted)
UNLISTED = {
    "ij,jk->ik": (lambda M, a, b: M.einsum("ij,jk->ik", a, b), [_n(4, 4), _n(4, 2)]),
    "...ij,...jk": (lambda M, a, b: M.einsum("...ij,...jk", a, b), [_n(3, 4, 4), _n(4, 2)]),
    "i,i->": (lambda M, a, b: M.einsum("i,i->", a, b), [_n(4), _n(4)]),
    "ij,jk,kl->il": (lambda M, a, b, c: M.einsum("ij,jk,kl->il", a, b, c), [_n(4, 4), _n(4, 3), _n(3, 2)]),
    "ij,jk,l->ikl": (lambda M, a, b, c: M.einsum("ij,jk,l->ikl", a, b, c), [_n(4, 4), _n(4, 3), _n(2)]),
    "ij,ij->ij": (lambda M, a, b: M.einsum("ij,ij->ij", a, b), [_n(4, 4), _n(4, 4)]),
    "i,j->ij": (lambda M, a, b: M.einsum("i,j->ij", a, b), [_n(4), _n(3)]),
    "ij->j": (lambda M, a: M.einsum("ij->j", a), [_n(4, 4)]),
    "ij,jk->ik size 1": (lambda M, a, b: M.einsum("ij,jk->ik", a, b), [_n(4, 1), _n(1, 3)]),
    "tensordot dims=0": (lambda M, a, b: M.tensordot(a, b, dims=0), [_n(4), _n(2)]),
    # two bmm per output feature (lowered), summed into a float32 output, then the bias
    "bilinear": (_bilinear, [_n(5, 4), _n(5, 2), _n(3, 4, 2), _n(3)]),
    "bilinear no bias": (_bilinear, [_n(2, 5, 4), _n(2, 5, 2), _n(3, 4, 2)]),
}


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("case", sorted(UNLISTED))
def test_ops_torch_builds_from_listed_ones_are_torchs(case, dtype):
    """``einsum`` and ``bilinear`` (not listed on the CPU) as torch's CPU kernels compute them under autocast:
    the dtype is torch's and the values equal torch's to float32's rounding (before, ``ij,jk->ik`` was float32,
    7e-3 from torch's bfloat16, and bilinear 1e-2 from its rounded products)."""
    fn, makers = UNLISTED[case]
    arrays = [make(RNG) for make in makers]
    with torch.autocast("cpu", dtype=getattr(torch, dtype)):
        want = fn(torch, *[torch.from_numpy(a) for a in arrays])
    names = [f"x{i}" for i in range(len(arrays))]

    def captured(**kw):
        with gc.autocast("cpu", dtype=dtype):
            return fn(gc, *(kw[n] for n in names))

    model = gc.capture(captured, **{n: gc.spec("float32", a.shape) for n, a in zip(names, arrays)})
    exact = want.float().numpy()
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run(dict(zip(names, arrays)))["output"]
        assert str(as_dtype(got.dtype)) == str(want.dtype).removeprefix("torch."), (case, backend)
        np.testing.assert_allclose(got.astype(np.float32), exact, rtol=1e-6, atol=1e-6 * np.abs(exact).max())


def _aten_lists():
    """torch 2.13's op lists for CUDA autocast (``ATen/autocast_mode.h``, shipped in the wheel): policy -> op names."""
    header = Path(torch.__file__).parent / "include" / "ATen" / "autocast_mode.h"
    if not header.exists():
        pytest.skip("this torch wheel ships no ATen headers")
    text = header.read_text()

    def names(macro):
        return set(re.findall(r"_\((\w+)", re.search(rf"#define {macro}\(_\)(.*?)\n\n", text, re.S).group(1)))

    fp32 = names("AT_FORALL_FP32") | names("AT_FORALL_FP32_SET_OPT_DTYPE") | {"norm"}  # norm: a redispatched one
    return {autocast_policy.LOWER: names("AT_FORALL_LOWER_PRECISION_FP"), autocast_policy.FP32: fp32,
            autocast_policy.PROMOTE: names("AT_FORALL_PROMOTE")}


# graphc ops that run through a listed one (torch's Python composites), and the listed ops graphc has under
# torch's name but does not wrap yet (none: convolution, frobenius_norm, grid_sampler, nuclear_norm, rms_norm and
# vdot were, and interpolate's upsample ops)
VIA = {"grid_sample": "grid_sampler", "linalg_cross": "cross", "cross_entropy": "nll_loss", "normalize": "norm",
       "softmin": "softmax"}
NOT_WRAPPED: set[str] = set()


def test_policy_cuda_column_is_torchs_source_lists():
    """The CUDA column against torch's own lists: each entry is in the list of its kind, and each listed op
    graphc has (``gc.X``, ``gc.linalg.X``, ``F.X``) is in the table with that kind (``einsum``, ``logsumexp``,
    ``linalg_vector_norm`` and ``linalg_matrix_norm`` were missing, and the CUDA entries of ``conv_tbc``,
    ``scaled_dot_product_attention``, ``linalg_vecdot`` and ``huber_loss``)."""
    lists = _aten_lists()
    for op, (_, cuda) in autocast_policy.POLICY.items():
        if cuda in lists:
            assert VIA.get(op, op) in lists[cuda], (op, cuda)
    for kind, names in lists.items():
        for name in sorted(names - NOT_WRAPPED):
            linalg = name.startswith("linalg_")
            if (getattr(gc.linalg, name.removeprefix("linalg_"), None) if linalg
                    else getattr(gc, name, None) or getattr(F, name, None)) is not None:
                assert autocast_policy.POLICY.get(name, (None, None))[1] == kind, (name, kind)


def test_cuda_einsum_lowers_and_norms_are_float32():
    """Under ``gc.autocast("cuda")`` einsum (any equation, as torch's listed kernel) gives float16 and
    ``logsumexp`` and the ``linalg`` vector and matrix norms of float16 give float32; the CPU leaves them."""

    def fn(x):
        h = gc.cast(x, "float16")
        return (gc.einsum("ij,ij->ij", x, x), gc.einsum("ij,jk->ik", x, x), gc.logsumexp(h, 1),
                gc.linalg.vector_norm(h), gc.linalg.matrix_norm(h), gc.linalg.norm(h))

    def dtypes(device):
        with gc.autocast(device):
            model = gc.capture(fn, x=gc.spec("float32", (3, 3)))
        return [str(as_dtype(int(o.dtype))) for o in model.ir.graph.outputs]

    assert dtypes("cuda") == ["float16"] * 2 + ["float32"] * 4
    assert dtypes("cpu") == ["float32", "bfloat16"] + ["float16"] * 4


def test_cuda_convolution_norms_vdot_grid_sampler_and_upsampling_follow_torchs_lists():
    """Under ``gc.autocast("cuda")`` ``convolution`` lowers to float16; ``frobenius_norm``, ``nuclear_norm``,
    ``rms_norm`` and ``interpolate`` (torch's ``upsample_*``, each mode) of float16 are float32; ``vdot`` and
    ``grid_sampler`` of float16 with float32 promote to float32. The CPU lists none of them but grid_sampler
    (float32 there), so it leaves the rest as given."""

    def fn(x, w, grid, v):
        h = gc.cast(x, "float16")
        outs = [gc.convolution(x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1),
                gc.frobenius_norm(h[0, 0]), gc.nuclear_norm(gc.cast(h[0, 0], "float32")), F.rms_norm(h, [4]),
                gc.grid_sampler(h, grid, 0, 0, False)]
        outs += [F.interpolate(h, scale_factor=2, mode=mode) for mode in ("nearest", "bilinear", "bicubic")]
        outs += [F.interpolate(h[0], scale_factor=2, mode="linear"), F.interpolate(h, scale_factor=0.5,
                                                                                   mode="bilinear", antialias=True)]
        return outs + ([gc.vdot(gc.cast(v, "float16"), v)] if gc.is_autocast_enabled("cuda") else [])

    def dtypes(device):
        with gc.autocast(device):
            model = gc.capture(fn, x=gc.spec("float32", (1, 2, 4, 4)), w=gc.spec("float32", (3, 2, 3, 3)),
                               grid=gc.spec("float32", (1, 3, 3, 2)), v=gc.spec("float32", (5,)))
        return [str(as_dtype(int(o.dtype))) for o in model.ir.graph.outputs]

    assert dtypes("cuda") == ["float16"] + ["float32"] * 10
    assert dtypes("cpu") == ["float32", "float16", "float32", "float16", "float32"] + ["float16"] * 5
