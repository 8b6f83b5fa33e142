"""A checkpoint records the structure of its inference graph (``graphc.model.structure``): the
training graphs it finds (beside it, or where its header says) are refused when they were
regenerated there as another model with the same tensor names, instead of exporting or resuming
its weights in that model; graphs regenerated with another loss still resume and export."""

import json
import re
import shutil

import numpy as np
import pytest
from safetensors.numpy import save_file

import graphc as gc
from graphc.compile.export import export_inference
from graphc.model import structure
from graphc.runtime import checkpoint as ckpt
from graphc.tensorfile import read_header
from cli_util import one_line_error, run_cli
from trainer_models import BNNet, blobs

ort = pytest.importorskip("onnxruntime")
LOSS = gc.losses.cross_entropy("logits", label="y")
X = blobs(9, seed=4)


class TanhNet(BNNet):
    def forward(self, x):
        return {"logits": self.fc2(gc.tanh(self.bn(self.fc1(x))))}


class LeakyNet(BNNet):
    def __init__(self, slope=0.1, hidden=16):
        super().__init__(hidden=hidden)
        self.slope = slope

    def forward(self, x):
        return {"logits": self.fc2(gc.nn.functional.leaky_relu(self.bn(self.fc1(x)), self.slope))}


class NoisyNet(BNNet):
    def __init__(self, scale=0.1):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        h = gc.relu(self.bn(self.fc1(x)))
        return {"logits": self.fc2(h + self.scale * gc.randn_like(h))}


def artifacts(model, loss=LOSS, seed=0):
    return gc.training.generate(gc.capture(model, seed=seed, x=gc.spec("float32", ("N", 8))), loss,
                                gc.optim.Adam(1e-2))


def trained(tmp_path, checkpoint):
    """A BNNet trained 2 epochs from ``tmp_path/arts``, checkpointed at ``checkpoint``; its logits on ``X``."""
    artifacts(BNNet()).save(tmp_path / "arts")
    trainer = gc.Trainer(tmp_path / "arts", backend="numpy")
    trainer.fit(gc.data.DataLoader(blobs(64), batch_size=16), 2, progress=False, checkpoint=checkpoint)
    return trainer.predict(X)["logits"]


def exported_logits(checkpoint, path):
    export_inference(checkpoint, path)
    return ort.InferenceSession(str(path)).run(None, {"x": X["x"]})[0]


def test_graphs_regenerated_in_place_as_another_model_are_refused(tmp_path, capsys):
    """The probe's repro: relu -> tanh, same tensor names. Before, export and gc.Trainer(file)
    took the tanh graphs silently (the exported logits 1.05 off the trained model's)."""
    ck = tmp_path / "ck.safetensors"
    trained(tmp_path, ck)
    shutil.rmtree(tmp_path / "arts")
    artifacts(TanhNet()).save(tmp_path / "arts")
    message = (rf"{ck}: the training graphs at {tmp_path / 'arts'} are not the ones this checkpoint was saved with "
               r".*node 2 is Tanh in the graphs, Relu when the checkpoint was saved")
    with pytest.raises(ckpt.CheckpointError, match=message):
        export_inference(ck, tmp_path / "m.onnx")
    with pytest.raises(ckpt.CheckpointError, match=message):
        gc.Trainer(ck, backend="numpy")
    assert "node 2 is Tanh in the graphs, Relu when" in one_line_error(
        run_cli(capsys, "export", str(ck), "-o", str(tmp_path / "m.onnx")))
    assert not (tmp_path / "m.onnx").exists()


def test_a_checkpoint_folders_graphs_replaced_by_another_models_are_refused(tmp_path):
    ck = tmp_path / "ck"
    trained(tmp_path, ck)
    shutil.rmtree(ck / "artifacts")
    artifacts(TanhNet()).save(ck / "artifacts")
    with pytest.raises(ckpt.CheckpointError, match=r"node 2 is Tanh in the graphs, Relu when"):
        gc.Trainer(ck, backend="numpy")


def test_graphs_regenerated_with_another_loss_still_resume_and_export(tmp_path):
    """The loss is not part of the inference graph: label smoothing added in place is allowed,
    and the export is the trained model (checked against the Trainer's own prediction)."""
    ck = tmp_path / "ck.safetensors"
    want = trained(tmp_path, ck)
    shutil.rmtree(tmp_path / "arts")
    artifacts(BNNet(), gc.losses.cross_entropy("logits", label="y", label_smoothing=0.2)).save(tmp_path / "arts")
    np.testing.assert_allclose(exported_logits(ck, tmp_path / "m.onnx"), want, rtol=1e-5, atol=1e-5)
    resumed = gc.Trainer(ck, backend="numpy")
    assert resumed.step_count == 8
    np.testing.assert_array_equal(resumed.predict(X)["logits"], want)


def test_a_checkpoint_without_the_structure_loads_as_before(tmp_path):
    """A header from before the structure was kept (the field absent) verifies and loads, and its
    graphs are not checked: regenerated ones are taken, as they were."""
    ck = tmp_path / "ck.safetensors"
    trained(tmp_path, ck)
    tensors, meta = ckpt.load(ck)
    assert meta.structure is not None
    before = meta.model_copy(update={"structure": None})  # as graphc wrote it then: digest and all
    before.digest = ckpt._digest(tensors, before)
    save_file(tensors, str(ck), metadata={"graphc": before.model_dump_json(exclude={"structure"})})
    assert "structure" not in json.loads(read_header(ck)[0]["__metadata__"]["graphc"])
    assert ckpt.load(ck)[1].structure is None
    shutil.rmtree(tmp_path / "arts")
    artifacts(TanhNet()).save(tmp_path / "arts")
    assert gc.Trainer(ck, backend="numpy").step_count == 8


@pytest.mark.parametrize("other, problem", [
    (TanhNet(), "node 2 is Tanh in the graphs, LeakyRelu when the checkpoint was saved"),
    (LeakyNet(slope=0.2), r"node 2 \(LeakyRelu\) has other attributes or inputs than when"),
    (LeakyNet(hidden=12), "inputs, outputs or initializers differ in name, dtype or shape"),
])
def test_the_first_difference_is_named(other, problem):
    saved = structure.of(artifacts(LeakyNet()).inference.ir)
    assert structure.difference(saved, structure.of(artifacts(LeakyNet()).inference.ir)) is None
    found = structure.difference(saved, structure.of(artifacts(other).inference.ir))
    assert found is not None and re.search(problem, found)


def test_the_structure_read_from_the_files_is_the_one_in_memory(tmp_path):
    """The Trainer reads it from its artifact directory, or from graphs it was given in memory:
    both are the same structure, so either kind of run's checkpoint checks its saved graphs."""
    from graphc.runtime.checkpoint_folder import structure_of

    arts = artifacts(LeakyNet())
    arts.save(tmp_path / "arts")
    assert structure_of(tmp_path / "arts") == structure.of(arts.inference.ir)
    trainer = gc.Trainer(arts, backend="numpy")
    trainer.save_checkpoint(tmp_path / "ck")
    assert ckpt.read_meta(tmp_path / "ck").structure == structure_of(tmp_path / "ck" / "artifacts")


def test_a_random_ops_seed_is_not_structure():
    """A model drawing noise in its inference graph, captured with another seed: the same model (its
    RandomNormalLike's ``seed`` attribute differs; before, "node 5 (RandomNormalLike) has other
    attributes" refused it); another noise scale still differs."""
    graphs = [artifacts(NoisyNet(), seed=seed).inference.ir.graph for seed in (0, 1)]
    seeds = [[n.attributes["seed"].value for n in g if n.op_type == "RandomNormalLike"] for g in graphs]
    assert len(seeds[0]) == 1 and seeds[0] != seeds[1]
    saved = structure.of(artifacts(NoisyNet()).inference.ir)
    assert structure.difference(saved, structure.of(artifacts(NoisyNet(), seed=1).inference.ir)) is None
    found = structure.difference(saved, structure.of(artifacts(NoisyNet(scale=0.2), seed=1).inference.ir))
    assert found is not None and "has other attributes or inputs" in found
