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


class GeluNet(BNNet):
    def forward(self, x):
        return {"logits": self.fc2(gc.nn.functional.gelu(self.bn(self.fc1(x))))}


class NoisyNet(BNNet):
    def __init__(self, scale=0.1):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        h = gc.relu(self.bn(self.fc1(x)))
        return {"logits": self.fc2(h + self.scale * gc.randn_like(h))}


def artifacts(model, loss=LOSS, seed=0, opset=21):
    return gc.training.generate(gc.capture(model, seed=seed, opset=opset, x=gc.spec("float32", ("N", 8))), loss,
                                gc.optim.Adam(1e-2))


def trained(tmp_path, checkpoint, model=None):
    """A BNNet (or ``model``) trained 2 epochs from ``tmp_path/arts``, checkpointed at ``checkpoint``; its
    logits on ``X``."""
    artifacts(model or BNNet()).save(tmp_path / "arts")
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
    message = (rf"{ck}: the training graphs at {tmp_path / 'arts'} are not the ones this checkpoint was saved with: "
               r"node 2 is Tanh in the graphs, Relu when the checkpoint was saved")
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


def tanh_logits(tensors, x):
    """The oracle: TanhNet's eval-mode forward in numpy float64 with ``tensors`` (BatchNorm on its
    running statistics)."""
    t = {n: np.asarray(a, np.float64) for n, a in tensors.items()}
    h = x @ t["fc1.weight"].T + t["fc1.bias"]
    h = (h - t["bn.running_mean"]) / np.sqrt(t["bn.running_var"] + 1e-5) * t["bn.weight"] + t["bn.bias"]
    return np.tanh(h) @ t["fc2.weight"].T + t["fc2.bias"]


@pytest.mark.parametrize("fresh", [False, True])
def test_graphs_given_explicitly_of_another_model_are_refused(tmp_path, fresh):
    """gc.Trainer(tanh artifacts).load_checkpoint(relu checkpoint): before, it loaded silently (as
    did --fresh-optimizer's params-only load), and trained and exported the tanh model."""
    ck = tmp_path / "ck.safetensors"
    trained(tmp_path, ck)
    artifacts(TanhNet()).save(tmp_path / "tanh")
    for trainer, graphs in ((gc.Trainer(tmp_path / "tanh", backend="numpy"), f"at {tmp_path / 'tanh'}"),
                            (gc.Trainer(artifacts(TanhNet()), backend="numpy"), "given in memory")):
        with pytest.raises(ckpt.CheckpointError, match=re.escape(
                f"{ck}: the training graphs {graphs} are not the ones this checkpoint was saved with: node 2 is Tanh "
                "in the graphs, Relu when the checkpoint was saved. Load it into its own graphs, or pass "
                "changed_model=True")):
            trainer.load_checkpoint(ck, fresh_optimizer=fresh)
        assert trainer.step_count == 0


def test_changed_model_loads_into_the_changed_model_and_its_checkpoint_records_it(tmp_path):
    """The opt-in: the relu checkpoint's tensors in the tanh graphs predict as the tanh model
    with them (numpy float64 oracle), train on, and the checkpoint saved then resumes without it."""
    ck = tmp_path / "ck"
    trained(tmp_path, ck)
    tensors = ckpt.load(ck)[0]
    trainer = gc.Trainer(artifacts(TanhNet()), backend="numpy")
    trainer.load_checkpoint(ck, changed_model=True)
    assert trainer.step_count == 8
    np.testing.assert_allclose(trainer.predict(X)["logits"], tanh_logits(tensors, X["x"]), rtol=1e-5, atol=1e-5)
    trainer.fit(gc.data.DataLoader(blobs(64), batch_size=16), 3, progress=False, checkpoint=ck)
    resumed = gc.Trainer(ck, backend="numpy")  # the folder's graphs are the tanh ones now, and its header says so
    assert resumed.step_count == 12
    np.testing.assert_array_equal(resumed.predict(X)["logits"], trainer.predict(X)["logits"])
    fresh = gc.Trainer(artifacts(BNNet()), backend="numpy")
    fresh.load_checkpoint(ck, fresh_optimizer=True, changed_model=True)  # and back, params only
    assert fresh.step_count == 0


def test_another_models_checkpoint_of_the_same_tensors_is_not_overwritten(tmp_path):
    """A new run of the tanh graphs saving where the relu model's checkpoint is: before, fit and
    save_checkpoint replaced it (only its tensors were compared)."""
    ck = tmp_path / "ck"
    trained(tmp_path, ck)
    saved = ckpt.resolve(ck).read_bytes()
    trainer = gc.Trainer(artifacts(TanhNet()), backend="numpy")
    refusal = re.escape(f"{ck} belongs to another model of the same tensors: node 2 is Tanh in the graphs, Relu when")
    with pytest.raises(ckpt.CheckpointError, match=refusal):
        trainer.fit(gc.data.DataLoader(blobs(64), batch_size=16), 1, progress=False, checkpoint=ck)
    with pytest.raises(ckpt.CheckpointError, match=refusal):
        trainer.save_checkpoint(ck)
    assert trainer.step_count == 0 and ckpt.resolve(ck).read_bytes() == saved
    trainer.save_checkpoint(tmp_path / "other")  # elsewhere it saves


def test_a_refused_changed_model_load_leaves_the_checkpoint_guarded(tmp_path):
    """load_checkpoint(changed_model=True) refused (another optimizer): before, the trainer had already
    taken the checkpoint as its own, and its save replaced the relu model's checkpoint."""
    ck = tmp_path / "ck"
    trained(tmp_path, ck)
    saved = ckpt.resolve(ck).read_bytes()
    graphs = gc.training.generate(gc.capture(TanhNet(), opset=21, x=gc.spec("float32", ("N", 8))), LOSS,
                                  gc.optim.SGD(1e-2))
    trainer = gc.Trainer(graphs, backend="numpy")
    with pytest.raises(ckpt.CheckpointError, match="optimizer"):
        trainer.load_checkpoint(ck, changed_model=True)
    with pytest.raises(ckpt.CheckpointError, match=re.escape(f"{ck} belongs to other")):
        trainer.save_checkpoint(ck)
    assert ckpt.resolve(ck).read_bytes() == saved


def test_cli_resume_into_another_models_graphs_names_the_option(tmp_path, capsys):
    """graphc train TANH_ARTS --checkpoint RELU_CK --resume: before, it resumed silently."""
    ck = tmp_path / "ck"
    trained(tmp_path, ck)
    artifacts(TanhNet()).save(tmp_path / "tanh")
    np.savez(tmp_path / "data.npz", **blobs(64))
    saved = ckpt.resolve(ck).read_bytes()
    train = ("train", tmp_path / "tanh", "--data", tmp_path / "data.npz", "--epochs", 3, "--batch-size", 16,
             "--backend", "numpy", "--no-progress", "--checkpoint", ck, "--resume")
    err = one_line_error(run_cli(capsys, *train))
    assert "node 2 is Tanh in the graphs, Relu when the checkpoint was saved" in err
    assert "--changed-model" in err and "changed_model=True" not in err
    assert ckpt.resolve(ck).read_bytes() == saved  # refused before any step
    done = run_cli(capsys, *train, "--changed-model")
    assert done.code == 0, done.err
    assert "resumed from" in done.out and gc.Trainer(ck, backend="numpy").step_count == 12


def test_a_held_and_an_unheld_initializer_of_one_type_hash_alike():
    """Before, a held tensor's shape was hashed as ints, an unheld value's as strings: one
    initializer of float[3, 4] had two ``values`` digests."""
    import onnx_ir as ir

    def values(held=None, shape=(3, 4)):
        """The structure's ``values`` digest of a graph of one float initializer ``w``: its tensor
        ``held``, or a value of ``shape`` that holds none."""
        w = (ir.Value(name="w", const_value=ir.tensor(held, name="w")) if held is not None else
             ir.Value(name="w", type=ir.TensorType(ir.DataType.FLOAT), shape=ir.Shape(shape)))
        return structure.of(ir.Model(ir.Graph([], [], nodes=[], initializers=[w], opset_imports={"": 21}),
                                     ir_version=10)).values

    assert values(held=np.zeros((3, 4), np.float32)) == values(shape=(3, 4))
    assert values(shape=(3, 4)) != values(shape=(3, 5))
    assert values(shape=("N", 4)) != values(shape=(3, 4))


def test_graphs_regenerated_at_another_opset_are_refused_naming_both_opsets(tmp_path):
    """GELU is one op from opset 20, Erf and Muls before: the model regenerated at opset 17 was
    refused as "node 2 is Constant in the graphs, Gelu ..."; now the refusal names both opsets and
    the one to regenerate at, and the graphs regenerated at it resume and export the trained model."""
    ck = tmp_path / "ck.safetensors"
    want = trained(tmp_path, ck, GeluNet())
    shutil.rmtree(tmp_path / "arts")
    artifacts(GeluNet(), opset=17).save(tmp_path / "arts")
    with pytest.raises(ckpt.CheckpointError, match=re.escape(
            "the graphs were generated at opset 17, the checkpoint at opset 21, where ops may be lowered otherwise "
            "(first difference: node 2 is Constant in the graphs, Gelu when the checkpoint was saved); regenerate "
            "them at opset 21")):
        gc.Trainer(ck, backend="numpy")
    shutil.rmtree(tmp_path / "arts")
    artifacts(GeluNet(), opset=21).save(tmp_path / "arts")
    np.testing.assert_allclose(exported_logits(ck, tmp_path / "m.onnx"), want, rtol=1e-5, atol=1e-5)


def test_a_model_lowered_alike_at_another_opset_is_the_same_structure(tmp_path):
    """BNNet's ops are the same at opsets 17 and 21: its checkpoint exports through graphs
    regenerated at 17 (the trained logits, checked against the Trainer's prediction)."""
    ck = tmp_path / "ck.safetensors"
    want = trained(tmp_path, ck)
    shutil.rmtree(tmp_path / "arts")
    artifacts(BNNet(), opset=17).save(tmp_path / "arts")
    np.testing.assert_allclose(exported_logits(ck, tmp_path / "m.onnx"), want, rtol=1e-5, atol=1e-5)


def test_a_header_from_before_the_opset_was_kept_verifies_and_is_checked(tmp_path):
    """A structure without ``opset`` (as the previous graphc wrote it, its digest without the
    field) loads, and regenerated graphs of another model are still refused, by node."""
    ck = tmp_path / "ck.safetensors"
    trained(tmp_path, ck)
    tensors, meta = ckpt.load(ck)
    before = meta.model_copy(update={"structure": meta.structure.model_copy(update={"opset": None})})
    before.digest = ckpt._digest(tensors, before)
    save_file(tensors, str(ck), metadata={"graphc": before.model_dump_json(exclude={"structure": {"opset"}})})
    assert "opset" not in json.loads(read_header(ck)[0]["__metadata__"]["graphc"])["structure"]
    assert ckpt.load(ck)[1].structure.opset is None
    shutil.rmtree(tmp_path / "arts")
    artifacts(TanhNet(), opset=17).save(tmp_path / "arts")
    with pytest.raises(ckpt.CheckpointError, match=r"saved with: node 2 is Tanh in the graphs, Relu when"):
        gc.Trainer(ck, backend="numpy")


def test_a_tampered_structure_is_refused_as_corrupted(tmp_path):
    """A header edited to record another structure: before, gc.Trainer(folder) blamed the graphs
    beside it ("node 2 is Relu in the graphs, Tanh when ..."); the header is what is wrong."""
    ck = tmp_path / "ck"
    trained(tmp_path, ck)
    tensors, meta = ckpt.load(ck)
    nodes = [n.replace("Relu:", "Tanh:") for n in meta.structure.nodes]
    edited = meta.model_copy(update={"structure": meta.structure.model_copy(update={"nodes": nodes})})
    save_file(tensors, str(ckpt.resolve(ck)), metadata={"graphc": edited.model_dump_json()})
    for load in (lambda: gc.Trainer(ck, backend="numpy"), lambda: export_inference(ck, tmp_path / "m.onnx"),
                 lambda: gc.Trainer(ck / "artifacts", backend="numpy").load_checkpoint(ck)):
        with pytest.raises(ckpt.CheckpointError, match="checkpoint is corrupted"):
            load()


def test_a_moved_checkpoint_folder_exports_by_a_relative_path(tmp_path, monkeypatch):
    """A checkpoint folder keeps its graphs beside it: moved, and named relative to another
    current directory, it exports the trained model; a file checkpoint whose recorded graphs
    moved says where it looked."""
    ck = tmp_path / "ck"
    want = trained(tmp_path, ck)
    gc.Trainer(ck, backend="numpy").save_checkpoint(tmp_path / "ck.safetensors")  # recording ck/artifacts
    (tmp_path / "sub").mkdir()
    shutil.move(ck, tmp_path / "sub" / "moved")
    monkeypatch.chdir(tmp_path / "sub")
    np.testing.assert_allclose(exported_logits("moved", tmp_path / "m.onnx"), want, rtol=1e-5, atol=1e-5)
    looked = re.escape(f"not beside it nor where it recorded them ({ck / 'artifacts'})")
    with pytest.raises(FileNotFoundError, match=looked):
        export_inference(tmp_path / "ck.safetensors", tmp_path / "m2.onnx")
