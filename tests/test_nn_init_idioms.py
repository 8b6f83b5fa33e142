"""torch's weight-initialisation idioms on gc.nn modules: ``p.data.normal_()`` in ``__init__``, HF's
``_init_weights`` through ``self.apply``, in-place edits under ``no_grad``, and every ``nn.init`` function with
torch's fan rules (random ones by their moments against torch's for the same shape, the others exactly)."""

import warnings

import numpy as np
import pytest

import graphc as gc
from graphc.errors import CaptureError

nn = gc.nn
RNG = np.random.default_rng(0)


class TCN(nn.Module):
    """A TCN block's ``init_weights`` as written for torch."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv1d(8, 16, 3)
        self.conv2 = nn.Conv1d(16, 16, 3)
        self.init_weights()

    def init_weights(self):
        self.conv1.weight.data.normal_(0, 0.01)
        self.conv2.weight.data.normal_(0, 0.01)

    def forward(self, x):
        return self.conv2(gc.relu(self.conv1(x)))


def test_tcn_normal_in_init_is_drawn_at_capture_from_its_seed():
    x = RNG.standard_normal((2, 8, 20)).astype(np.float32)
    nets = [TCN() for _ in range(3)]
    models = [gc.capture(net, seed=seed, x=x) for net, seed in zip(nets, (0, 0, 1))]
    w = [net.conv2.weight.data for net in nets]
    assert abs(float(np.std(w[0])) - 0.01) < 0.001 and abs(float(np.mean(w[0]))) < 0.001  # 768 draws
    np.testing.assert_array_equal(w[0], w[1])  # the same seed, the same model
    assert not np.array_equal(w[0], w[2])
    np.testing.assert_array_equal(models[0].params["conv2.weight"], w[0])
    # the biases keep torch's default U(-1/sqrt(fan_in), 1/sqrt(fan_in)): fan_in 16 * 3
    assert 0.1 < np.abs(nets[0].conv2.bias.data).max() <= 1 / np.sqrt(48)


class TinyBert(nn.Module):
    """HF's ``_init_weights`` through ``self.apply``, with its ``isinstance`` checks."""

    def __init__(self, initializer_range=0.02):
        super().__init__()
        self.initializer_range = initializer_range
        self.emb = nn.Embedding(50, 32, padding_idx=3)
        self.dense = nn.Linear(32, 64)
        self.norm = nn.LayerNorm(64)
        self.apply(self._init_weights)

    def _init_weights(self, module):
        if isinstance(module, nn.Linear):
            module.weight.data.normal_(mean=0.0, std=self.initializer_range)
            if module.bias is not None:
                module.bias.data.zero_()
        elif isinstance(module, nn.Embedding):
            module.weight.data.normal_(mean=0.0, std=self.initializer_range)
            if module.padding_idx is not None:
                module.weight.data[module.padding_idx].zero_()
        elif isinstance(module, nn.LayerNorm):
            module.bias.data.zero_()
            module.weight.data.fill_(1.0)

    def forward(self, ids):
        return self.norm(self.dense(self.emb(ids)))


def test_hf_init_weights_through_apply():
    net = TinyBert()
    model = gc.capture(net, ids=np.array([[1, 3, 7]]))
    emb = net.emb.weight.data
    np.testing.assert_array_equal(emb[3], 0)
    rows = np.delete(emb, 3, axis=0)
    assert abs(rows.std() - 0.02) < 0.001 and abs(net.dense.weight.data.std() - 0.02) < 0.001
    np.testing.assert_array_equal(net.dense.bias.data, 0)
    np.testing.assert_array_equal(net.norm.weight.data, 1)
    np.testing.assert_array_equal(net.norm.bias.data, 0)
    np.testing.assert_array_equal(model.params["emb.weight"], emb)


def test_in_place_edits_on_held_values_are_exact():
    torch = pytest.importorskip("torch")
    net = nn.Linear(4, 3)
    net.init_parameters(5)
    w0 = net.weight.data.copy()
    with gc.no_grad():
        assert net.weight.mul_(0.5) is net.weight
    net.weight.data.add_(1.0, alpha=2).clamp_(-1, 2.5).sub_(0.25).div_(2)
    t = torch.from_numpy(w0.astype(np.float64))
    want = ((t * 0.5).add_(1.0, alpha=2).clamp_(-1, 2.5) - 0.25) / 2
    np.testing.assert_allclose(net.weight.data, want.numpy(), rtol=1e-6)
    net.init_parameters(6)  # an edited value is the user's: kept, as one loaded
    np.testing.assert_allclose(net.weight.data, want.numpy(), rtol=1e-6)
    arr = RNG.standard_normal((3,)).astype(np.float32)
    net.bias.data.copy_(gc.tensor(arr))
    np.testing.assert_array_equal(net.bias.data, arr)
    other = nn.Linear(4, 3)
    other.weight.data = net.weight.data.clone()
    net.weight.data[0].fill_(7)
    assert (net.weight.data[0] == 7).all() and not (other.weight.data[0] == 7).any()


def test_edits_before_the_draw_compose_into_the_initialiser():
    net = nn.Linear(20, 30)
    net.weight.data.fill_(2.0)                  # a value now
    net.weight.data[:, :5].mul_(3).clamp_(max=5)
    net.bias.data.uniform_(-0.1, 0.1)           # drawn at initialisation
    net.bias.data[-1].zero_()
    assert net.weight.drawn and not net.bias.drawn and net.bias.size(0) == 30 and net.weight.dim() == 2
    net.init_parameters(0)
    np.testing.assert_array_equal(net.weight.data[:, :5], 5)
    np.testing.assert_array_equal(net.weight.data[:, 5:], 2)
    b = net.bias.data
    assert b[-1] == 0 and np.abs(b).max() <= 0.1 and np.abs(b[:-1]).min() > 0


def test_reading_an_undrawn_value_says_how_to_draw_it():
    net = nn.Linear(4, 3)
    with pytest.raises(CaptureError, match=r"no values yet: .*init_parameters\(seed\)"):
        np.asarray(net.weight.data)
    with pytest.raises(CaptureError, match="std: the parameter has no values yet"):
        net.weight.data.std()
    with pytest.raises(CaptureError, match=r"expected a value that broadcasts to \[3, 4\], got shape \[5\]"):
        net.weight.data.copy_(np.zeros(5))
    with pytest.raises(CaptureError, match="makes a copy"):
        net.weight.data[[0, 2]].zero_()
    with pytest.raises(CaptureError, match="generator= is not taken"):
        net.weight.data.normal_(generator=object())


def _fans(shape):
    receptive = int(np.prod(shape[2:]))
    return shape[1] * receptive, shape[0] * receptive


SHAPES = {"linear": (64, 96), "conv2d": (32, 16, 3, 3), "lstm_ih": (4 * 24, 40)}


@pytest.mark.parametrize("case", [
    ("xavier_uniform_", dict(gain=1.7)), ("xavier_normal_", dict(gain=0.8)),
    ("kaiming_uniform_", dict(a=0.1)), ("kaiming_normal_", dict(mode="fan_out", nonlinearity="relu")),
    ("kaiming_uniform_", dict(mode="fan_out", nonlinearity="leaky_relu", a=0.2)),
    ("trunc_normal_", dict(std=0.3, a=-0.4, b=0.4)), ("uniform_", dict(a=-0.3, b=0.7)), ("normal_", dict(mean=1, std=2)),
], ids=lambda c: f"{c[0]}{sorted(c[1].items())}")
@pytest.mark.parametrize("layer", sorted(SHAPES))
def test_random_inits_have_torchs_moments_and_bounds(case, layer):
    """Each draw's std, mean and range against torch's for the same shape (about 3000-6000 draws: a std within
    6%, where a fan_in/fan_out mix-up is off by 22% or more for these shapes)."""
    torch = pytest.importorskip("torch")
    fn, kwargs = case
    shape = SHAPES[layer]
    p = nn.Parameter(shape=shape)
    assert getattr(nn.init, fn)(p.data if layer == "conv2d" else p, **kwargs) is not None
    p.draw(np.random.default_rng(1))
    t = torch.empty(shape, dtype=torch.float64)
    torch.manual_seed(0)
    getattr(torch.nn.init, fn)(t, **kwargs)
    got, want = p.data.astype(np.float64), t.numpy()
    assert abs(got.std() / want.std() - 1) < 0.06, (got.std(), want.std())
    assert abs(got.mean() - want.mean()) < 0.1 * want.std()
    if fn.endswith("uniform_") or fn == "trunc_normal_":  # the same bounds: within 2% of torch's extremes
        assert got.min() >= want.min() - 0.02 * np.ptp(want) and got.max() <= want.max() + 0.02 * np.ptp(want)
        assert got.min() <= want.min() + 0.02 * np.ptp(want) and got.max() >= want.max() - 0.02 * np.ptp(want)


def test_deterministic_inits_equal_torchs():
    torch = pytest.importorskip("torch")
    cases = [("constant_", (5, 7), dict(val=0.3)), ("zeros_", (4,), {}), ("ones_", (2, 3, 4), {}),
             ("eye_", (3, 5), {}), ("dirac_", (6, 3, 3, 3), dict(groups=2)), ("dirac_", (4, 4, 5), {})]
    for fn, shape, kwargs in cases:
        p = nn.Parameter(shape=shape)
        getattr(nn.init, fn)(p, **kwargs)
        p.draw(np.random.default_rng(0))
        t = getattr(torch.nn.init, fn)(torch.empty(shape), **kwargs)
        np.testing.assert_array_equal(p.data, t.numpy(), err_msg=fn)


@pytest.mark.parametrize("shape", [(6, 10), (10, 6), (8, 2, 3)])
def test_orthogonal_rows_or_columns_are_orthonormal_times_gain(shape):
    p = nn.Parameter(shape=shape, dtype="float64")
    nn.init.orthogonal_(p, gain=1.5)
    p.draw(np.random.default_rng(2))
    flat = p.data.reshape(shape[0], -1)
    gram = flat @ flat.T if flat.shape[0] <= flat.shape[1] else flat.T @ flat
    np.testing.assert_allclose(gram, 2.25 * np.eye(len(gram)), atol=1e-12)


def test_lstm_gates_initialised_one_by_one_through_slices_of_data():
    """``for i in range(4): orthogonal_(w.data[i*H:(i+1)*H])``, the forget gate's bias 1, as LSTM ports do."""
    lstm, hidden = nn.LSTM(5, 4), 4
    for name, param in lstm.named_parameters():
        if "weight_hh" in name:
            for gate in range(4):
                nn.init.orthogonal_(param.data[gate * hidden:(gate + 1) * hidden])
        elif "bias" in name:
            param.data.zero_()
            param.data[hidden:2 * hidden].fill_(1.0)
    lstm.init_parameters(3)
    w = lstm.weight_hh_l0.data.astype(np.float64)
    for gate in range(4):
        block = w[gate * hidden:(gate + 1) * hidden]
        np.testing.assert_allclose(block @ block.T, np.eye(hidden), atol=1e-6)
    np.testing.assert_array_equal(lstm.bias_ih_l0.data, np.repeat([0, 1, 0, 0], hidden))


def test_torchs_deprecated_names_fill_with_its_warning():
    p = nn.Parameter(shape=(30, 40))
    with pytest.warns(FutureWarning, match=r"`nn.init.xavier_uniform` is now deprecated in favor of "
                                           r"`nn.init.xavier_uniform_`"):
        assert nn.init.xavier_uniform(p, gain=2.0) is p
    p.draw(np.random.default_rng(0))
    bound = 2.0 * np.sqrt(6 / 70)
    assert np.abs(p.data).max() <= bound and np.abs(p.data).max() > 0.95 * bound
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        nn.init.constant(p, 0.5)
    p.draw(np.random.default_rng(0))
    np.testing.assert_array_equal(p.data, 0.5)


def test_graphc_has_every_torch_init_function():
    torch = pytest.importorskip("torch")
    public = {n for n in dir(torch.nn.init) if not n.startswith("_") and callable(getattr(torch.nn.init, n))
              and getattr(getattr(torch.nn.init, n), "__module__", "") == "torch.nn.init"}
    assert public - set(dir(nn.init)) == set()
