"""An Embedding's padding_idx row gets no gradient in torch; a dynamo export looks it up with a
plain Gather, whose gradient reached that row (BERT's ``word_embeddings`` row 0: 7e-4 of the
largest gradient off torch's, and trained). The exporter's record of torch's call restores it."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import graphc as gc


def test_the_padding_row_of_an_embedding_is_not_trained_like_torch(tmp_path):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Embedding(10, 4, padding_idx=2), torch.nn.Tanh(), torch.nn.Linear(4, 3))
    ids, y = torch.tensor([[2, 1, 2], [5, 2, 9]]), torch.randn(2, 3, 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (ids,), dynamo=True, optimize=False, verbose=False, input_names=["ids"],
                          output_names=["out"]).save(tmp_path / "emb.onnx")
    arts = gc.training.generate(gc.load(tmp_path / "emb.onnx"), gc.losses.mse("out", label="y"), gc.optim.SGD(0.5))
    assert "Where" not in {n.op_type for n in arts.inference.proto.graph.node}  # inference: the plain lookup
    torch.nn.functional.mse_loss(net(ids), y).backward()
    want = net[0].weight.grad.numpy()
    assert not want[2].any() and want[1].any()
    feeds = {"ids": ids.numpy(), "y": y.numpy()}
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(arts.gradients, backend=backend).run(feeds)
        np.testing.assert_allclose(got["0.weight_grad"], want, rtol=1e-5, atol=1e-7, err_msg=backend)
        np.testing.assert_allclose(got["2.weight_grad"], net[2].weight.grad.numpy(), rtol=1e-5, atol=1e-7)
    trainer = gc.Trainer(arts, backend="ort-cpu")
    trainer.step(feeds)
    np.testing.assert_array_equal(trainer.params["0.weight"][2], arts.state["0.weight"][2])
    forward = gc.Session(arts.eval, backend="numpy").run(feeds)["out"]
    with torch.no_grad():
        np.testing.assert_allclose(forward, net(ids).numpy(), rtol=1e-6)
