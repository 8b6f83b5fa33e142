"""Class labels and indices out of range. A model's own cross_entropy / nll_loss outside the Trainer: a
``gc.Session`` (``graphc run``) refuses those it reads from an input, and labels the model
computes (sliced, shifted, gathered) make the loss NaN; a negative multi_margin_loss target makes
its loss NaN; a negative embedding / index_select index fails in the backend. torch 2.13 raises on
each."""

import numpy as np
import pytest

import graphc as gc
from graphc import nn
from trainer_models import Prototypes

RNG = np.random.default_rng(0)
BACKENDS = ["numpy", "ort-cpu"]
F = gc.nn.functional


class OwnLoss(nn.Module):
    """``loss(fc(x), labels(y))``: the model's own class loss of labels it takes or computes."""

    def __init__(self, loss, labels=lambda y: y):
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.loss, self.labels = loss, labels

    def forward(self, x, y):
        return {"loss": self.loss(self.fc(x), self.labels(y))}


def _torch_loss(session: gc.Session, x: np.ndarray, labels: np.ndarray, loss: str, **options):
    """torch's ``loss`` of the session's ``fc`` on ``x``: its value, or the error torch raises."""
    torch = pytest.importorskip("torch")
    params = {name: torch.from_numpy(np.asarray(p)) for name, p in session.model.params.items()}
    logits = torch.from_numpy(x) @ params["fc.weight"].T + params["fc.bias"]
    if loss == "nll_loss":
        logits = torch.log_softmax(logits, 1)
    return getattr(torch.nn.functional, loss)(logits, torch.from_numpy(labels), **options).item()


def _capture(loss: str, labels=lambda y: y, y_shape=("N",), **options):
    """``loss`` of ``labels(y)``, ``y`` of ``y_shape`` (a batch of ``y_shape[0]``)."""
    fn = getattr(F, loss)
    return gc.capture(OwnLoss(lambda z, t: fn(z if loss == "cross_entropy" else gc.log_softmax(z, dim=1), t,
                                              **options), labels),
                      seed=0, x=gc.spec("float32", (y_shape[0], 4)), y=gc.spec("int64", y_shape))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("ignore_index", [-100, -1])
def test_a_session_refuses_a_label_out_of_range_of_a_models_own_loss(backend, loss, ignore_index):
    """Running the loss graph (an evaluation script, ``graphc run``) with a label of C or -1 gave a
    finite wrong loss (0.873 for a label of 3, where torch raises); the run now names the input,
    the position, the value and the range. The ignore index still runs to torch's loss."""
    session = gc.Session(_capture(loss, ignore_index=ignore_index), backend=backend)
    x, labels = RNG.standard_normal((8, 4)).astype(np.float32), np.arange(8) % 3
    for bad in (3, -1 if ignore_index != -1 else -5):
        wrong = labels.copy()
        wrong[2] = bad
        with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
            _torch_loss(session, x, wrong, loss, ignore_index=ignore_index)
        with pytest.raises(gc.InputError, match=rf"a run: label 'y' holds {bad} at \(2,\); cross_entropy / nll_loss "
                                                rf"labels are class indices in \[0, 3\) or the ignore index "
                                                rf"{ignore_index}"):
            session.run({"x": x, "y": wrong})
    labels[2] = ignore_index
    expected = _torch_loss(session, x, labels, loss, ignore_index=ignore_index)
    assert session.run({"x": x, "y": labels})["loss"] == pytest.approx(expected, rel=1e-5)


# labels(y), y from the labels wanted, y's shape
COMPUTED = {"column": (lambda y: y[:, 0], lambda labels: np.stack([labels, labels[::-1]], 1), ("N", 2)),
            "shifted": (lambda y: y - 1, lambda labels: labels + 1, ("N",)),
            "gathered": (lambda y: y.flatten()[gc.tensor(np.arange(0, 16, 2))], lambda labels: np.repeat(labels, 2).reshape(8, 2),
                         (8, 2))}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("loss", ["cross_entropy", "nll_loss"])
@pytest.mark.parametrize("how", sorted(COMPUTED))
@pytest.mark.parametrize("options", [{}, {"label_smoothing": 0.1}, {"weight": [1.0, 2.0, 0.5]}],
                         ids=["plain", "smoothed", "weighted"])
def test_labels_the_model_computes_out_of_range_make_the_loss_nan(backend, loss, how, options):
    """Labels sliced, shifted or gathered from an input inside the model: no host check can read
    them, and a label of C or -1 gave a finite wrong loss (0.873 plain, 0.910 smoothed, 0.904
    weighted), where torch raises; the loss is now NaN on each backend, and in range it is torch's."""
    if loss == "nll_loss" and "label_smoothing" in options:
        pytest.skip("nll_loss has no label smoothing")
    torch = pytest.importorskip("torch")
    pick, feed, shape = COMPUTED[how]
    weight = options.get("weight")
    graph_options = {**options, "weight": gc.tensor(np.asarray(weight, np.float32))} if weight else options
    torch_options = {**options, "weight": torch.tensor(weight)} if weight else options
    session = gc.Session(_capture(loss, pick, shape, **graph_options), backend=backend)
    x, labels = RNG.standard_normal((8, 4)).astype(np.float32), np.arange(8) % 3
    expected = _torch_loss(session, x, labels, loss, **torch_options)
    assert session.run({"x": x, "y": feed(labels)})["loss"] == pytest.approx(expected, rel=1e-5)
    for bad in (3, -1):
        wrong = labels.copy()
        wrong[2] = bad
        with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
            _torch_loss(session, x, wrong, loss, **torch_options)
        assert np.isnan(session.run({"x": x, "y": feed(wrong)})["loss"])


class PrototypeLoss(Prototypes):
    """The model's own cross_entropy over ``[N, 2K]`` logits: a class count no input names."""

    def forward(self, x, protos, y):
        return {"loss": F.cross_entropy(super().forward(x, protos)["logits"], y)}


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_label_past_a_class_count_the_model_computes_makes_the_step_loss_nan(backend):
    """C = 2K computed inside the model: a label of 2K passed the host check (only >= 0 is known)
    and trained on a finite wrong loss, where torch raises; the step's loss is now NaN (which
    stops ``fit``)."""
    torch = pytest.importorskip("torch")
    model = gc.capture(PrototypeLoss(twice=True), seed=0, x=gc.spec("float32", ("N", 4)),
                       protos=gc.spec("float32", ("K", 4)), y=gc.spec("int64", ("N",)))
    trainer = gc.Trainer(gc.training.generate(model, "loss", gc.optim.SGD(0.1)), backend=backend)
    batch = {"x": RNG.standard_normal((6, 4)).astype(np.float32), "protos": RNG.standard_normal((3, 4)).astype(np.float32),
             "y": np.array([0, 1, 5, 3, 4, 6])}
    with pytest.raises((IndexError, RuntimeError), match="out of bounds"):
        torch.nn.functional.cross_entropy(torch.zeros(6, 6), torch.from_numpy(batch["y"]))
    assert np.isnan(trainer.step(batch))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("options", [{}, {"p": 2}, {"weight": [1.0, 2.0, 0.5]}], ids=["p1", "p2", "weighted"])
def test_a_negative_multi_margin_target_makes_the_loss_nan(backend, options):
    """A target of -1 read the last class's score (Gather from the end): a finite wrong loss
    (0.873 weighted) where torch raises "target out of range"; the loss is now NaN, and in range
    it is torch's. A target of C fails in the backend's Gather, as before."""
    torch = pytest.importorskip("torch")
    weight = options.get("weight")
    graph_options = {**options, "weight": gc.tensor(np.asarray(weight, np.float32))} if weight else options
    torch_options = {**options, "weight": torch.tensor(weight)} if weight else options
    model = gc.capture(lambda x, y: F.multi_margin_loss(x, y, **graph_options),
                       x=gc.spec("float32", ("N", 3)), y=gc.spec("int64", ("N",)))
    session = gc.Session(model, backend=backend)
    x, labels = RNG.standard_normal((4, 3)).astype(np.float32), np.array([0, 1, 2, 1])
    expected = torch.nn.functional.multi_margin_loss(torch.from_numpy(x), torch.from_numpy(labels), **torch_options)
    assert session.run({"x": x, "y": labels})["output"] == pytest.approx(expected.item(), rel=1e-5)
    labels[2] = -1
    with pytest.raises(RuntimeError, match="target out of range"):
        torch.nn.functional.multi_margin_loss(torch.from_numpy(x), torch.from_numpy(labels), **torch_options)
    assert np.isnan(session.run({"x": x, "y": labels})["output"])
    labels[2] = 3
    with pytest.raises(gc.BackendError, match="Gather"):
        session.run({"x": x, "y": labels})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", ["embedding", "nn.Embedding", "index_select"])
def test_a_negative_index_fails_as_torchs(backend, op):
    """``F.embedding`` / ``nn.Embedding`` / ``gc.index_select`` with an index of -1 returned the last
    row (ONNX's Gather reads negatives from the end) where torch raises; the backend now fails
    on it, naming the node and the source line. ``x[idx]`` still reads -1 from the end, as torch."""
    torch = pytest.importorskip("torch")
    weight = RNG.standard_normal((5, 3)).astype(np.float32)
    layer = nn.Embedding(5, 3)
    fn = {"embedding": lambda i: F.embedding(i, gc.tensor(weight)), "nn.Embedding": layer,
          "index_select": lambda i: gc.index_select(gc.tensor(weight), 0, i)}[op]
    oracle = {"embedding": lambda i: torch.nn.functional.embedding(i, torch.from_numpy(weight)),
              "nn.Embedding": lambda i: torch.nn.Embedding(5, 3)(i),
              "index_select": lambda i: torch.index_select(torch.from_numpy(weight), 0, i)}[op]
    session = gc.Session(gc.capture(fn, i=gc.spec("int64", (3,))), backend=backend)
    index = np.array([0, 4, 2])
    if op != "nn.Embedding":
        np.testing.assert_array_equal(session.run({"i": index})["output"], oracle(torch.from_numpy(index)).numpy())
    index[1] = -1
    with pytest.raises((IndexError, RuntimeError), match="out of range|out of DATA bounds"):
        oracle(torch.from_numpy(index))
    with pytest.raises(gc.BackendError, match="Gather"):
        session.run({"i": index})
    rows = gc.Session(gc.capture(lambda i: gc.tensor(weight)[i], i=gc.spec("int64", (3,))), backend=backend)
    np.testing.assert_array_equal(rows.run({"i": index})["output"], weight[index])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lengths,message", [([7, 6], [3, 3]), ([6, 6], [-1, 3]), ([-1, 6], [3, 3])],
                         ids=["input-past-T", "negative-target", "negative-input"])
def test_ctc_lengths_torch_refuses_make_the_loss_nan(backend, lengths, message):
    """Input lengths past T or below 0, or a negative target length, given as Tensors: torch raises
    ("Expected input_lengths to have value at most 6"), the graph gave a finite loss (1.157 for an
    input length of 7, 5.254 for a target length of -1); it is now NaN, and torch's for valid ones."""
    torch = pytest.importorskip("torch")
    log_probs = torch.randn(6, 2, 4, generator=torch.Generator().manual_seed(0)).log_softmax(2).numpy()
    targets = np.array([[1, 2, 3], [1, 2, 1]])
    model = gc.capture(F.ctc_loss, log_probs=gc.spec("float32", (6, 2, 4)), targets=gc.spec("int64", (2, 3)),
                       input_lengths=gc.spec("int64", (2,)), target_lengths=gc.spec("int64", (2,)))
    session = gc.Session(model, backend=backend)

    def both(inputs, target_lengths):
        feeds = {"log_probs": log_probs, "targets": targets, "input_lengths": np.array(inputs),
                 "target_lengths": np.array(target_lengths)}
        return session.run(feeds)["output"], lambda: torch.nn.functional.ctc_loss(
            *(torch.from_numpy(feeds[k]) for k in ("log_probs", "targets", "input_lengths", "target_lengths")))

    got, expected = both([6, 5], [3, 2])
    assert got == pytest.approx(expected().item(), rel=1e-5)
    got, refused = both(lengths, message)
    with pytest.raises(RuntimeError, match="Expected"):
        refused()
    assert np.isnan(got)
