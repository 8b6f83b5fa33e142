"""``gc.Trainer(..., cuda_graph=True)``: the train_step captured and replayed as CUDA graphs on
ort-cuda (``graphc.runtime.cuda_graph``).

Oracle: the same Trainer without graphs, on the same device with TF32 off, fed the same batches
(steps, a smaller last batch that runs without a graph, an lr change, a checkpoint loaded mid-run).
What needs no GPU runs everywhere: the shape specialization and Size/Shape folding, the Concat
and Split trees, the random-op check, the refusals, and the Trainer's graph bookkeeping on ort-cpu
posing as CUDA (repeating a new graph's first run, as onnxruntime does).
"""

from __future__ import annotations

import numpy as np
import onnx
import onnx.helper as oh
import onnx_ir as ir
import pytest

import graphc as gc
from backend_params import EXACT_CUDA, on_cuda
from graphc import nn
from graphc.errors import BackendError
from graphc.runtime.cuda_graph import MAX_FAN, GraphedStep, capturable, random_nodes, specialize
from graphc.runtime.trainer import without_initializers
from trainer_models import bn_artifacts, blobs, drop_bn_artifacts

F = onnx.TensorProto.FLOAT


class ConvNet(nn.Module):
    """Conv -> BatchNorm2d -> ReLU -> MaxPool -> depthwise Conv -> global pool -> Linear."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.pool = nn.MaxPool2d(2)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.gap = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(8, 3)

    def forward(self, x):
        h = self.dw(self.pool(gc.relu(self.bn(self.conv(x)))))
        return {"logits": self.fc(gc.flatten(self.gap(h), 1))}


class DeepMLP(nn.Module):
    """20 Linear layers: 40 params, so the fused update concatenates (and splits) over 32 tensors."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(8, 8) for _ in range(19)] + [nn.Linear(8, 3)])

    def forward(self, x):
        for layer in self.layers:
            x = gc.relu(layer(x)) if layer is not self.layers[-1] else layer(x)
        return {"logits": x}


def deep_artifacts():
    model = gc.capture(DeepMLP(), seed=0, x=gc.spec("float32", ("N", 8)))
    return gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.AdamW(1e-2))


def conv_artifacts():
    model = gc.capture(ConvNet(), seed=0, x=gc.spec("float32", ("N", 3, 8, 8)))
    return gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.AdamW(1e-2),
                                device="cuda")


def images(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((n, 3, 8, 8)).astype(np.float32), "y": rng.integers(0, 3, n).astype(np.int64)}


# -- without a GPU ------------------------------------------------------------------------------

def test_specialize_fixes_the_batch_dims_everywhere_they_are_named():
    x = oh.make_tensor_value_info("x", F, ["N", 4])
    y = oh.make_tensor_value_info("y", F, ["N", 4])
    t = oh.make_tensor_value_info("t", F, ["N", "M"])
    model = oh.make_model(oh.make_graph([oh.make_node("Relu", ["x"], ["t"]), oh.make_node("Neg", ["t"], ["y"])],
                                        "g", [x], [y], value_info=[t]))
    fixed = specialize(model, {"x": (32, 4)})
    dims = lambda v: [d.dim_value if d.HasField("dim_value") else d.dim_param for d in v.type.tensor_type.shape.dim]
    assert dims(fixed.graph.input[0]) == [32, 4] and dims(fixed.graph.output[0]) == [32, 4]
    assert dims(fixed.graph.value_info[0]) == [32, "M"]  # a dim no input fixes stays symbolic
    assert dims(model.graph.input[0]) == ["N", 4]  # the model itself is left as it was
    with pytest.raises(ValueError, match="input 'x' has rank 2, the batch's array 3"):
        specialize(model, {"x": (32, 4, 1)})


def test_specialized_train_step_computes_what_the_general_one_does():
    arts = bn_artifacts()
    batch = blobs(16, seed=3)
    shapes = {n: batch[n].shape for n in ("x", "y")}
    general = gc.Trainer(arts, backend="ort-cpu")
    step = without_initializers(arts.train_step.proto, set(general._entries))
    exe_general = gc.backends.get_backend("ort-cpu").prepare(step)
    exe_fixed = gc.backends.get_backend("ort-cpu").prepare(specialize(step, shapes))
    feeds = {**batch, **{n: general._host(h) for n, h in general._state.items()}}
    out_general, out_fixed = exe_general.run(feeds), exe_fixed.run(feeds)
    assert set(out_general) == set(out_fixed)
    for name, value in out_general.items():
        np.testing.assert_array_equal(out_fixed[name], value, err_msg=name)


def test_capturable_folds_size_and_shape_and_keeps_the_results():
    arts = bn_artifacts()
    batch = blobs(16, seed=3)
    trainer = gc.Trainer(arts, backend="ort-cpu")
    step = without_initializers(arts.train_step.proto, set(trainer._entries))
    assert {"Size"} <= {n.op_type for n in step.graph.node}  # the BatchNorm gradient counts the batch
    fixed = capturable(step, {n: batch[n].shape for n in ("x", "y")})
    assert not {"Size", "Shape"} & {n.op_type for n in fixed.graph.node}
    feeds = {**batch, **{n: trainer._host(h) for n, h in trainer._state.items()}}
    cpu = gc.backends.get_backend("ort-cpu")
    want, got = cpu.prepare(step).run(feeds), cpu.prepare(fixed).run(feeds)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


@pytest.mark.parametrize("width", [MAX_FAN, MAX_FAN + 1, 70, MAX_FAN * MAX_FAN + 5])
def test_wide_concat_and_split_become_trees_of_narrow_ones(width):
    sizes = [1 + k % 3 for k in range(width)]
    inputs = [oh.make_tensor_value_info(f"x{k}", F, [2, s]) for k, s in enumerate(sizes)]
    split_sizes = onnx.numpy_helper.from_array(np.array(sizes, np.int64), "sizes")
    nodes = [oh.make_node("Concat", [v.name for v in inputs], ["cat"], name="cat", axis=1),
             oh.make_node("Neg", ["cat"], ["neg"]),
             oh.make_node("Split", ["neg", "sizes"], [f"y{k}" for k in range(width)], name="split", axis=1)]
    outputs = [oh.make_tensor_value_info("cat", F, [2, sum(sizes)])] + \
        [oh.make_tensor_value_info(f"y{k}", F, [2, s]) for k, s in enumerate(sizes)]
    model = oh.make_model(oh.make_graph(nodes, "g", inputs, outputs, [split_sizes]),
                          opset_imports=[oh.make_opsetid("", 17)])
    narrow = capturable(model, {})
    onnx.checker.check_model(narrow, full_check=True)
    widths = [len(n.input) if n.op_type == "Concat" else len(n.output) for n in narrow.graph.node
              if n.op_type in ("Concat", "Split")]
    assert max(widths) <= MAX_FAN and (len(widths) > 2) == (width > MAX_FAN)
    rng = np.random.default_rng(0)
    feeds = {v.name: rng.standard_normal((2, s)).astype(np.float32) for v, s in zip(inputs, sizes)}
    cpu = gc.backends.get_backend("ort-cpu")
    want, got = cpu.prepare(model).run(feeds), cpu.prepare(narrow).run(feeds)
    for name, value in want.items():
        np.testing.assert_array_equal(got[name], value, err_msg=name)


def test_random_ops_are_found_also_in_subgraphs():
    drop = oh.make_node("Dropout", ["x", "r", "t"], ["y"], name="drop")
    plain_drop = oh.make_node("Dropout", ["x"], ["y2"], name="eval_drop")
    rand = oh.make_node("RandomUniformLike", ["x"], ["u"], name="u")
    body = oh.make_graph([rand], "body", [], [oh.make_tensor_value_info("u", F, [1])])
    branch = oh.make_node("If", ["c"], ["u"], name="if", then_branch=body, else_branch=body)
    graph = ir.serde.deserialize_graph(oh.make_graph([drop, plain_drop, branch], "g", [], []))
    assert [(n.name, n.op_type) for n in random_nodes(graph)] == [("drop", "Dropout"), ("u", "RandomUniformLike"),
                                                                  ("u", "RandomUniformLike")]


def test_a_graph_that_draws_random_numbers_is_refused():
    x = oh.make_tensor_value_info("x", F, [2])
    model = oh.make_model(oh.make_graph([oh.make_node("RandomUniformLike", ["x"], ["y"], name="noise")], "g", [x],
                                        [oh.make_tensor_value_info("y", F, [2])]))

    class FakeCuda:
        name, device = "ort-cuda", "cuda"

    with pytest.raises(BackendError, match=r"draws random numbers itself \(noise \(RandomUniformLike\)\)"):
        GraphedStep(FakeCuda(), model, ir.serde.deserialize_graph(model.graph), ["x"], {})


def test_the_refusal_names_five_random_nodes_and_counts_the_others():
    nodes = [oh.make_node("RandomUniformLike", ["x"], [f"y{i}"], name=f"noise{i}") for i in range(7)]
    graph = ir.serde.deserialize_graph(oh.make_graph(nodes, "g", [oh.make_tensor_value_info("x", F, [2])], []))

    class FakeCuda:
        name, device = "ort-cuda", "cuda"

    with pytest.raises(BackendError, match=r"itself \(noise0 \(RandomUniformLike\), noise1 .*, noise4 "
                                           r"\(RandomUniformLike\) and 2 more\); "):
        GraphedStep(FakeCuda(), onnx.ModelProto(), graph, ["x"], {})


@pytest.mark.parametrize("backend", ["ort-cpu", "numpy"])
def test_cuda_graph_needs_the_cuda_provider(backend):
    with pytest.raises(ValueError, match=f"cuda_graph needs the CUDA provider .*not '{backend}'"):
        gc.Trainer(bn_artifacts(), backend=backend, cuda_graph=True)


def test_cuda_graph_is_refused_for_workers():
    with pytest.raises(ValueError, match="cuda_graph is an option of the one-process Trainer"):
        gc.Trainer(bn_artifacts(), backend="ort-cpu", workers=2, cuda_graph=True)


# -- on the GPU ------------------------------------------------------------------------------------

# full float32, and cuDNN's heuristic algorithm (the same in both sessions) rather than a timed search
EXACT = {"providers_options": {**EXACT_CUDA["providers_options"], "cudnn_conv_algo_search": "DEFAULT"}}
CLOSE = {"rel": 1e-4, "abs": 1e-6}


def pair(arts):
    return (gc.Trainer(arts, backend="ort-cuda", cuda_graph=True, **EXACT), gc.Trainer(arts, backend="ort-cuda", **EXACT))


def graphs_expected(trainer) -> int:
    """1 graph where every carried output is written in place, else 2 (the ping-pong pair)."""
    return 2 if set(trainer._feeds) - trainer._in_place else 1


def assert_same_state(graphed, plain, rtol=1e-4, atol=1e-5):
    for name, value in plain.state_dict().items():
        np.testing.assert_allclose(graphed.state_dict()[name], value, rtol=rtol, atol=atol, err_msg=name)


@on_cuda
@pytest.mark.parametrize("make, data", [(bn_artifacts, lambda n, s: blobs(n, seed=s)),
                                        (drop_bn_artifacts, lambda n, s: blobs(n, seed=s)),
                                        (deep_artifacts, lambda n, s: blobs(n, seed=s)),
                                        (conv_artifacts, images)], ids=["mlp-bn", "dropout", "40-params", "conv"])
def test_graph_replays_train_like_ordinary_steps(make, data):
    arts = make()
    graphed, plain = pair(arts)
    for step in range(12):
        batch = data(16, step % 3)
        assert graphed.step(batch) == pytest.approx(plain.step(batch), **CLOSE), step
    assert graphed._graphed.graphs == graphs_expected(graphed)  # captured once, then replayed
    assert_same_state(graphed, plain)


@on_cuda
@pytest.mark.filterwarnings("ignore:cuda_graph. a batch of other shapes:UserWarning")
def test_other_batch_shapes_lr_changes_and_a_loaded_checkpoint_keep_the_graphs_right(tmp_path):
    arts = conv_artifacts()
    graphed, plain = pair(arts)
    for step in range(8):
        batch = images(16 if step != 5 else 6, step)  # step 5: a smaller batch, run without a graph
        assert graphed.step(batch) == pytest.approx(plain.step(batch), **CLOSE), step
    graphed.lr = plain.lr = 3e-3  # written into the buffer the graphs read
    for step in range(8, 12):
        assert graphed.step(images(16, step)) == pytest.approx(plain.step(images(16, step)), **CLOSE)
    assert graphed._graphed.graphs == graphs_expected(graphed)
    plain.save_checkpoint(tmp_path / "ckpt.safetensors")
    for step in range(12, 15):  # moves on past the checkpoint ...
        graphed.step(images(16, step))
    graphed.load_checkpoint(tmp_path / "ckpt.safetensors")  # ... and back: new buffers, new graphs
    for step in range(12, 20):
        assert graphed.step(images(16, step)) == pytest.approx(plain.step(images(16, step)), **CLOSE)
    assert graphed._graphed.graphs == 2 * graphs_expected(graphed)
    assert_same_state(graphed, plain)


@on_cuda
def test_fit_with_train_metrics_on_graphs():
    arts = bn_artifacts()
    data = blobs(96, seed=0)
    histories = [t.fit(gc.data.DataLoader(data, batch_size=16, shuffle=False), epochs=3, progress=False)
                 for t in (gc.Trainer(arts, backend="ort-cuda", cuda_graph=True, metrics=["accuracy"], **EXACT),
                           gc.Trainer(arts, backend="ort-cuda", metrics=["accuracy"], **EXACT))]
    for graphed, plain in zip(*(h.epochs for h in histories)):
        assert graphed.loss == pytest.approx(plain.loss, **CLOSE)
        assert graphed.metrics == pytest.approx(plain.metrics)


class CpuPosingAsCuda:
    """ort-cpu under the CUDA backend's name, recording each run's graph id and, as onnxruntime's
    CUDA provider does, running the model ``capture_runs`` times in the first run of a graph id:
    the Trainer's graph bookkeeping (staged batches, bound outputs, one id per set of addresses,
    the state put back after a capture) checked without a GPU."""

    name, device = "ort-cuda", "cuda"

    def __init__(self, capture_runs: int = 3):
        self.ids: list[int | None] = []
        self.capture_runs = capture_runs

    def prepare(self, model, cuda_graph=False, **options):
        exe = gc.backends.get_backend("ort-cpu").prepare(model, **options)
        run_bound = exe.run_bound

        def recorded(*args, graph_id=None, **kwargs):
            repeat = self.capture_runs if graph_id is not None and graph_id >= 0 and graph_id not in self.ids else 1
            self.ids.append(graph_id)
            for _ in range(repeat):
                result = run_bound(*args, graph_id=None, **kwargs)
            return result

        exe.run_bound = recorded
        return exe


@pytest.mark.parametrize("in_place", [True, False], ids=["in-place", "ping-pong"])
def test_graph_bookkeeping_without_a_gpu(in_place):
    arts = drop_bn_artifacts()
    graphed, plain = gc.Trainer(arts, backend="ort-cpu"), gc.Trainer(arts, backend="ort-cpu")
    assert graphed._in_place == set(graphed._feeds)  # Adam's fused update writes every output in place
    if not in_place:
        graphed._in_place = set()  # every output ping-pongs between two buffers
    posing = CpuPosingAsCuda()
    step = without_initializers(arts.train_step.proto, set(graphed._entries))
    graphed._graphed = GraphedStep(posing, step, arts.train_step.ir.graph,
                                   [s.name for s in graphed.batch_specs + graphed.noise_specs],
                                   {"mem_pattern": False})
    sizes = [16, 16, 16, 10, 16, 16, 16, 16]  # the 10: another shape, the general session without a graph
    for i, n in enumerate(sizes):
        if n == 10:
            with pytest.warns(UserWarning, match=r"a batch of other shapes or dtypes \(x \(10, 8\), y \(10,\), "
                                                 r"dropout_noise.0 \(10, 16\)\) than the first \(x \(16, 8\), "
                                                 r"y \(16,\), dropout_noise.0 \(16, 16\)\) runs without a CUDA graph"):
                assert graphed.step(blobs(n, seed=i)) == plain.step(blobs(n, seed=i)), i
        else:
            assert graphed.step(blobs(n, seed=i)) == plain.step(blobs(n, seed=i)), i
    # the first run sizes the loss buffer (no graph); in place, every step binds the same buffers;
    # ping-pong, the pair alternates (A->B: 2, B->A: 1) and the general step in between flips it.
    # A new id's first run (the capture, its state put back after) comes twice
    assert posing.ids == ([-1, 1] + [1] * 6 if in_place else [-1, 1, 1, 2, 2, 2, 1, 2, 1])
    graphed.lr = plain.lr = 1e-3
    before, ids = graphed._state["lr"], set(posing.ids)
    assert graphed.step(blobs(16, seed=9)) == plain.step(blobs(16, seed=9))
    assert graphed._state["lr"] is before and posing.ids[-1] in ids  # written in place: a graph it had
    graphed._reset_state(plain.state_dict())  # new buffers: a new graph
    assert graphed.step(blobs(16, seed=10)) == plain.step(blobs(16, seed=10))
    assert posing.ids[-2:] == [max(ids) + 1] * 2 and graphed._graphed.graphs == max(ids) + 1
    for name, value in plain.state_dict().items():
        np.testing.assert_array_equal(graphed.state_dict()[name], value, err_msg=name)


@pytest.mark.filterwarnings("ignore:cuda_graph. a batch of other shapes:UserWarning")
def test_graphed_conv_net_trains_like_the_plain_one_without_a_gpu():
    """The cuda-lowered conv net (im2col, depthwise taps, BatchNorm counts) through the graphed
    path on ort-cpu posing as CUDA: the capturable copy of its step trains as the general one."""
    arts = conv_artifacts()
    graphed, plain = gc.Trainer(arts, backend="ort-cpu"), gc.Trainer(arts, backend="ort-cpu")
    step = without_initializers(arts.train_step.proto, set(graphed._entries))
    graphed._graphed = GraphedStep(CpuPosingAsCuda(), step, arts.train_step.ir.graph, ["x", "y"],
                                   {"mem_pattern": False})
    for i in range(6):
        batch = images(16 if i != 3 else 5, i)
        assert graphed.step(batch) == pytest.approx(plain.step(batch), rel=1e-6, abs=1e-7), i
    for name, value in plain.state_dict().items():
        np.testing.assert_allclose(graphed.state_dict()[name], value, rtol=1e-5, atol=1e-7, err_msg=name)
