"""gc.grad with a gc.losses spec: the loss graph is spliced as training does; bad `loss` is named."""

import numpy as np
import onnx
import pytest

import graphc as gc
import training_models

RNG = np.random.default_rng(0)


def batch(n=6, din=8, classes=4):
    return {"x": RNG.normal(size=(n, din)).astype(np.float32), "y": RNG.integers(0, classes, n).astype(np.int64)}


def test_a_cross_entropy_spec_adds_the_label_input_and_the_loss_output():
    model = training_models.mlp()
    g = gc.grad(model, gc.losses.cross_entropy("logits", label="y"))
    inputs = {s.name: s for s in g.inputs}
    assert list(inputs)[:2] == ["x", "y"] and inputs["y"].dtype == "int64" and inputs["y"].shape == ("batch",)
    assert [s.name for s in g.outputs] == ["logits", "loss", *(f"{p}_grad" for p in model.params)]

    feeds = batch()
    out = gc.Session(g, backend="numpy").run(feeds)
    logits = gc.Session(model, backend="numpy").run({"x": feeds["x"]})["logits"]
    shifted = logits - logits.max(axis=1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    np.testing.assert_allclose(out["loss"], -log_probs[np.arange(6), feeds["y"]].mean(), rtol=1e-5)


@pytest.mark.parametrize("spec", [gc.losses.cross_entropy("logits", label="y", label_smoothing=0.1),
                                  gc.losses.huber("logits", label="t", delta=0.5)])
def test_gradients_equal_those_of_the_training_artifacts(spec):
    model = training_models.mlp()
    feeds = {"x": batch()["x"]}
    feeds[spec.label] = batch()["y"] if spec.kind == "cross_entropy" else RNG.normal(size=(6, 4)).astype(np.float32)
    got = gc.Session(gc.grad(model, spec), backend="numpy").run(feeds)
    arts = gc.training.generate(model, spec, gc.optim.SGD(0.1))
    expected = gc.Session(arts.gradients, backend="numpy").run(feeds)
    assert {k for k in got if k.endswith("_grad")} == {k for k in expected if k.endswith("_grad")} != set()
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-7, err_msg=name)


def test_wrt_still_selects_the_parameters():
    g = gc.grad(training_models.mlp(), gc.losses.mse("logits", label="t"), wrt=["fc2.bias"])
    assert [s.name for s in g.outputs] == ["logits", "loss", "fc2.bias_grad"]
    # one name as a string is that name (it was read letter by letter: "no input named 'f'")
    g = gc.grad(training_models.mlp(), gc.losses.mse("logits", label="t"), wrt="fc2.bias")
    assert [s.name for s in g.outputs] == ["logits", "loss", "fc2.bias_grad"]
    arts = gc.training.generate(training_models.mlp(), gc.losses.mse("logits", label="t"), gc.optim.SGD(0.1),
                                frozen="fc1.*")
    assert sorted(arts.manifest.frozen) == ["fc1.bias", "fc1.weight"]


@pytest.mark.parametrize("loss, error, message", [
    ({"kind": "mse"}, TypeError, "loss must be the name of a scalar output or a gc.losses spec .* got dict"),
    (None, TypeError, "got NoneType"),
    (gc.losses.mse("nope", label="t"), gc.GraphError, r"loss output 'nope' is not an output of the model; outputs: \['logits'\]"),
    (gc.losses.mse("logits", label="x"), gc.GraphError, "the name 'x' is already used in the model"),
])
def test_a_bad_loss_says_what_loss_takes(loss, error, message):
    with pytest.raises(error, match=message):
        gc.grad(training_models.mlp(), loss)


def test_a_spec_on_a_model_that_already_outputs_loss_is_refused():
    proto = training_models.mlp().proto
    proto.graph.output[0].name = "loss"
    proto.graph.node[-1].output[0] = "loss"
    with pytest.raises(gc.GraphError, match="already has an output named 'loss'.*gc.grad\\(model, 'loss'\\)"):
        gc.grad(gc.load(proto), gc.losses.mse("loss", label="t"))


def test_a_spec_on_a_model_whose_input_or_value_is_named_loss():
    """An input named ``loss`` is refused, naming it; a value inside the model of that name is
    renamed (it once made a second value named ``loss``, which onnx's checker refuses)."""
    proto = training_models.mlp().proto
    proto.graph.input[0].name = "loss"
    for node in proto.graph.node:
        node.input[:] = ["loss" if i == "x" else i for i in node.input]
    with pytest.raises(gc.GraphError, match="the model's input 'loss' \\(the loss spec's loss"):
        gc.grad(gc.load(proto), gc.losses.mse("logits", label="t"))
    proto = training_models.mlp().proto
    inner = proto.graph.node[0].output[0]
    for node in proto.graph.node:
        node.output[:] = ["loss" if o == inner else o for o in node.output]
        node.input[:] = ["loss" if i == inner else i for i in node.input]
    g = gc.grad(gc.load(proto), gc.losses.mse("logits", label="t"))
    onnx.checker.check_model(g.proto, full_check=True)
    feeds = {"x": np.ones((2, 8), np.float32), "t": np.zeros((2, 4), np.float32)}
    expected = gc.grad(training_models.mlp(), gc.losses.mse("logits", label="t"))
    got, want = gc.Session(g, backend="numpy").run(feeds), gc.Session(expected, backend="numpy").run(feeds)
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-6, err_msg=name)
