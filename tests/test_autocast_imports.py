"""``generate(autocast=...)`` on torch.onnx exports against torch 2.13's ``torch.autocast("cpu")``
training loop from the same init: a CNN (conv, BatchNorm, relu, max pool, linear) and a transformer
encoder block, SGD and AdamW, bfloat16 and float16 with loss scaling, numpy and ort-cpu. The params
stay float32 master weights; the activations flow in bfloat16 as torch's, so the first step's
gradients are torch autocast's (to float32 rounding; the attention's through its fused kernel's
backward), which graphc's float32 graphs miss by bfloat16's rounding."""

from __future__ import annotations

import io
import warnings

import numpy as np
import onnx
import pytest
from typer.testing import CliRunner

import graphc as gc
from graphc.cli import app

try:
    from test_autodiff_models import mlp_model
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_models import mlp_model

torch = pytest.importorskip("torch")

RNG = np.random.default_rng(0)
STEPS = 3
OPTIMIZERS = {"sgd": (gc.optim.SGD(0.05), torch.optim.SGD), "adamw": (gc.optim.AdamW(1e-2), torch.optim.AdamW)}


class _CNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1, bias=False)
        self.bn = torch.nn.BatchNorm2d(8)
        self.fc = torch.nn.Linear(8 * 4 * 4, 5)

    def forward(self, x):  # the max pool sees torch's bfloat16 activations, ties included
        return self.fc(torch.nn.functional.max_pool2d(torch.relu(self.bn(self.conv(x))), 2).flatten(1))


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.block = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.head = torch.nn.Linear(16, 5)

    def forward(self, x):
        return self.head(self.block(x).mean(1))


# how much closer than float32's run, over STEPS steps (numpy; SGD, AdamW): CNN losses 2e-7 against
# float32's 7e-4 to 4e-3, params 2e-8 to 3e-6 against 3e-3 to 8e-3. Transformer: SGD losses 2.4e-7
# against 2.4e-4, params 3e-9 against 4e-5; AdamW 1.2e-7 against 3.5e-4 and 2e-8 against 1.1e-2
# (numpy), but 9e-5 against 3.3e-4 and 1.6e-3 against 1.1e-2 (ort-cpu's batches): one element of
# the attention output's bfloat16 gradient, 2 float32 ulps from a rounding tie after LayerNorm's
# backward, rounds the other way at step 2, and AdamW turns the key bias's gradient (0 but for
# rounding) into sign-sized steps (docs/api.md). Before the attention's fused backward and the
# in-projection's bias added as torch's: params 1.4e-2 against 1.2e-2
CLOSER = {"cnn": 4, "transformer": 3}
_MODELS = {"cnn": (_CNN, (3, 8, 8)), "transformer": (_Block, (6, 16))}


def _setup(name: str, init=None):
    """The torch module (seeded, then given to ``init``), its TorchScript export (opset 17, no
    constant folding: the module's own params) and STEPS batches of 16."""
    cls, shape = _MODELS[name]
    torch.manual_seed(0)
    net = cls()
    if init is not None:
        init(net)
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net.eval(), (torch.zeros(2, *shape),), buf, dynamo=False, opset_version=17,
                          do_constant_folding=False, input_names=["x"], output_names=["out"],
                          dynamic_axes={"x": {0: "N"}})
    batches = [{"x": RNG.standard_normal((16, *shape)).astype(np.float32), "y": RNG.integers(0, 5, 16)}
               for _ in range(STEPS)]
    return net, gc.load(buf.getvalue()), batches


def _torch_run(net, opt_cls, lr, batches, dtype=None, scaler=None):
    """torch's loop from ``net``'s init (a copy): per step the loss; the params at the end."""
    torch.manual_seed(0)
    net = type(net)().train()
    opt = opt_cls(net.parameters(), lr=lr)
    losses = []
    for batch in batches:
        opt.zero_grad()
        with torch.autocast("cpu", dtype=dtype or torch.bfloat16, enabled=dtype is not None):
            out = net(torch.from_numpy(batch["x"]))
        loss = torch.nn.functional.cross_entropy(out.float(), torch.from_numpy(batch["y"]))
        if scaler is None:
            loss.backward()
            opt.step()
        else:
            scaler.scale(loss).backward()
            scaler.step(opt)
            scaler.update()
        losses.append(loss.item())
    return np.array(losses), {k: v.detach().numpy() for k, v in net.named_parameters()}


def _graphc_run(model, spec, batches, backend, autocast=None, loss_scale=None):
    arts = gc.training.generate(model, gc.losses.cross_entropy("out", label="y"), spec, autocast=autocast,
                                loss_scale=loss_scale)
    trainer = gc.Trainer(arts, backend=backend)
    losses = np.array([float(trainer.step(b)) for b in batches])
    return arts, losses, trainer.state_dict()


def _distance(a: dict, b: dict) -> float:
    """The params' (or gradients') difference over all of them, relative: |a - b| / |b| (2-norms)."""
    return float(np.sqrt(sum(np.sum((a[k].astype(np.float64) - v) ** 2) for k, v in b.items())
                         / sum(np.sum(v.astype(np.float64) ** 2) for v in b.values())))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
@pytest.mark.parametrize("opt", list(OPTIMIZERS))
@pytest.mark.parametrize("name", list(_MODELS))
def test_bfloat16_trains_as_torch_autocast(name, opt, backend):
    """STEPS steps: losses and params within bfloat16's rounding of torch autocast's run, at least
    CLOSER x closer to it than graphc's float32 run is (which fails where autocast is ignored)."""
    spec, opt_cls = OPTIMIZERS[opt]
    net, model, batches = _setup(name)
    want_losses, want = _torch_run(net, opt_cls, spec.lr, batches, torch.bfloat16)
    arts, losses, state = _graphc_run(model, spec, batches, backend, "bfloat16")
    _, plain_losses, plain = _graphc_run(model, spec, batches, backend)
    closer = CLOSER[name]
    ours, theirs = np.max(np.abs(losses - want_losses)), np.max(np.abs(plain_losses - want_losses))
    assert ours < 1e-3 and ours * closer < theirs, (ours, theirs)
    ours, theirs = _distance(state, want), _distance(plain, want)
    assert ours < 3e-2 and ours * closer < theirs, (ours, theirs)
    assert all(state[k].dtype == np.float32 for k in want)


def _first_gradients(name: str, backend: str, init=None) -> tuple[dict, dict, dict]:
    """torch autocast's first gradients of ``name`` (``init``: as ``_setup``'s) and graphc's with
    and without autocast."""
    net, model, batches = _setup(name, init)
    net.train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = net(torch.from_numpy(batches[0]["x"]))
    torch.nn.functional.cross_entropy(out.float(), torch.from_numpy(batches[0]["y"])).backward()
    want = {k: v.grad.numpy() for k, v in net.named_parameters()}
    loss = gc.losses.cross_entropy("out", label="y")
    got = []
    for autocast in ("bfloat16", None):
        arts = gc.training.generate(model, loss, gc.optim.SGD(0.1), autocast=autocast)
        grads = gc.Session(arts.gradients, backend=backend).run(batches[0])
        got.append({k: grads[f"{k}_grad"] for k in want})
    return want, *got


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_first_step_gradients_are_torch_autocasts(backend):
    """The CNN's first gradients equal torch autocast's to float32 rounding (measured 7e-9
    relative), where float32's differ by bfloat16's (1e-2 to 2e-2)."""
    want, ours, plain = _first_gradients("cnn", backend)
    assert _distance(ours, want) < 1e-5 and _distance(plain, want) > 1e-3


_IN_PROJECTION = ("block.self_attn.in_proj_weight", "block.self_attn.in_proj_bias")


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_transformer_first_gradients_follow_torch_autocasts_dtype_flow(backend):
    """The transformer block's activations flow in bfloat16 as torch's (linear rounded once with
    its bias, relu and the reshapes in bfloat16, the residual adds and LayerNorms in float32,
    attention as torch's flash kernel, forward and backward): every gradient is torch autocast's
    to float32 rounding (1.7e-7 over all, numpy; 7e-8 ort-cpu; float32 graphs 6.6e-3, linear1.weight
    5e-2). The in-projection's equal torch's (0; float32 graphs 1e-2): with the nodes' own backward
    through attention (dy @ v^T rounded, the gradient through the max the kernel divides by) they
    were 3.5e-3 off."""
    want, ours, plain = _first_gradients("transformer", backend)
    assert _distance(ours, want) < 1e-6 and _distance(plain, want) > 1e-3
    projection = {k: want[k] for k in _IN_PROJECTION}
    assert _distance(ours, projection) < 1e-6 and _distance(plain, projection) > 1e-3


def _in_projection_bias(net) -> None:
    with torch.no_grad():
        net.block.self_attn.in_proj_bias.copy_(torch.from_numpy(RNG.standard_normal(48).astype(np.float32) * 0.5))


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_in_projection_of_a_permuted_input_rounds_its_product_before_the_bias(backend):
    """torch's linear fuses the bias (addmm, one rounding) only for a contiguous input: the
    in-projection reads the batch-first input transposed, so torch rounds x @ W^T to bfloat16 and
    then adds the bias (add_, rounded again). With a nonzero in_proj_bias the first gradients are
    torch autocast's to float32 rounding (5e-8 numpy, 4e-8 ort-cpu; the in-projection's 0); rounding
    once, as a contiguous input's, left them 5.4e-3 / 7.0e-3 off, no closer than float32's 4e-3 / 1e-2."""
    want, ours, plain = _first_gradients("transformer", backend, _in_projection_bias)
    assert _distance(ours, want) < 1e-6 and _distance(plain, want) > 1e-3
    _, model, _ = _setup("transformer", _in_projection_bias)
    arts = gc.training.generate(model, gc.losses.cross_entropy("out", label="y"), gc.optim.SGD(0.1),
                                autocast="bfloat16")
    nodes = {n.name: n for n in arts.train_step.ir.graph}
    bf16 = onnx.TensorProto.BFLOAT16
    assert nodes["/block/self_attn/MatMul"].outputs[0].dtype == bf16  # rounded before the Add
    assert [v.dtype for v in nodes["/block/linear1/MatMul"].outputs] == [onnx.TensorProto.FLOAT]  # fused


def test_a_fused_kernels_backward_needs_its_rule_and_its_nodes():
    """A node marked as the end of a fused kernel with no rule, or of the flash attention kernel
    without its nodes, is an AutodiffError naming it, never the nodes' own backward."""
    from graphc.passes.values import FUSED_GRADIENT_KEY

    for kernel, message in (("fused_relu", "ends a fused kernel 'fused_relu' that has no gradient rule; fused "
                                           "kernels with rules: cpu_flash_attention"),
                            ("cpu_flash_attention", "ends a cpu_flash_attention kernel, but its value 'h1' is "
                                                    "not a MatMul's output \\(got Add\\)")):
        proto = mlp_model()
        relu = next(n for n in proto.graph.node if n.name == "relu")
        relu.metadata_props.add(key=FUSED_GRADIENT_KEY, value=kernel)
        with pytest.raises(gc.AutodiffError, match=f"node 'relu' {message}"):
            gc.grad(gc.load(proto), "loss")


def test_transformer_ops_run_in_torch_autocasts_dtypes():
    """Relu and the moves run in bfloat16, the residual Adds and LayerNormalization in float32,
    the scaled q and k and the Softmax in float32, the loss in float32; the prediction output is
    float32 under its name."""
    _, model, _ = _setup("transformer")
    arts = gc.training.generate(model, gc.losses.cross_entropy("out", label="y"), gc.optim.SGD(0.1),
                                autocast="bfloat16")
    graph = arts.train_step.ir.graph
    dtypes = {n.name: n.outputs[0].dtype for n in graph}
    bf16, f32 = onnx.TensorProto.BFLOAT16, onnx.TensorProto.FLOAT
    assert dtypes["/block/Relu"] == dtypes["/block/self_attn/Transpose_8"] == bf16
    assert dtypes["/block/Add"] == dtypes["/block/Add_1"] == dtypes["/block/norm1/LayerNormalization"] == f32
    assert dtypes["/block/self_attn/Mul_1"] == dtypes["/block/self_attn/Softmax"] == f32
    assert all(dtypes[n.name] == f32 for n in graph if n.name.startswith("loss/") and n.outputs[0].dtype
               in (bf16, f32))
    assert next(v for v in graph.outputs if v.name == "out").dtype == f32


@pytest.mark.parametrize("backend", ["numpy", "ort-cpu"])
def test_float16_with_loss_scaling_trains_as_torch_autocast_and_grad_scaler(backend):
    """float16 autocast + GradScaler (growth_interval 2: the scale grows) vs torch's on the CPU:
    the same scales, losses and params within float16's rounding (the Conv and Gemm run as float16
    ops, which the numpy backend and onnxruntime's CPU MatMul accumulate in float16, where torch's
    CPU kernels accumulate in float32: no closer to torch's run than float32's)."""
    spec, opt_cls = OPTIMIZERS["sgd"]
    net, model, batches = _setup("cnn")
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10, growth_interval=2)
    want_losses, want = _torch_run(net, opt_cls, spec.lr, batches, torch.float16, scaler)
    scale = gc.amp.GradScaler(init_scale=2.0 ** 10, growth_interval=2)
    _, losses, state = _graphc_run(model, spec, batches, backend, "float16", scale)
    assert state["loss_scale"] == scaler.get_scale() == 2.0 ** 11
    np.testing.assert_allclose(losses, want_losses, rtol=2e-3)
    assert _distance(state, want) < 2e-3
    assert all(state[k].dtype == np.float32 for k in want)


def test_params_stay_float32_and_each_value_is_cast_once(tmp_path):
    """Params (manifest, state, checkpoint) float32; the Gemm runs in bfloat16 and the Conv (no
    bfloat16 Conv before opset 22) in float32 between round trips; one Cast per value and dtype;
    eval and inference as without autocast; the artifacts pass onnx's full check."""
    _, model, batches = _setup("cnn")
    loss = gc.losses.cross_entropy("out", label="y")
    arts = gc.training.generate(model, loss, gc.optim.AdamW(1e-3), autocast="bfloat16")
    plain = gc.training.generate(model, loss, gc.optim.AdamW(1e-3))
    assert arts.manifest.autocast == "bfloat16" and plain.manifest.autocast is None
    params = {e.name: e.dtype for e in arts.manifest.graphs["train_step"].inputs if e.role == "param"}
    assert set(params) == {"conv.weight", "bn.weight", "bn.bias", "fc.weight", "fc.bias"}
    assert set(params.values()) == {"float32"}
    graph = arts.train_step.ir.graph
    gemm = next(n for n in graph if n.op_type == "Gemm" and n.name.startswith("/fc"))
    assert [v.dtype for v in gemm.inputs] == [onnx.TensorProto.BFLOAT16] * 3
    conv = next(n for n in graph if n.op_type == "Conv" and n.name.startswith("/conv"))
    assert [v.producer().op_type for v in conv.inputs] == ["Cast", "Cast"]
    casts = [(n.inputs[0].name, n.attributes["to"].as_int()) for n in graph if n.op_type == "Cast"]
    assert len(casts) == len(set(casts))
    for key in ("eval", "inference"):
        ops = [[n.op_type for n in getattr(a, key).ir.graph] for a in (arts, plain)]
        assert ops[0] == ops[1] and "BFLOAT16" not in str(getattr(arts, key).proto)
    arts.save(tmp_path / "arts")
    for path in (tmp_path / "arts").glob("*.onnx"):
        onnx.checker.check_model(str(path), full_check=True)
    trainer = gc.Trainer(tmp_path / "arts", backend="ort-cpu")
    trainer.step(batches[0])
    trainer.save_checkpoint(tmp_path / "ck")
    state = gc.Trainer(tmp_path / "ck", backend="numpy").state_dict()
    assert all(state[p].dtype == np.float32 for p in params)


def test_bad_autocast_is_refused_and_float16_without_loss_scaling_warns():
    _, model, _ = _setup("cnn")
    loss = gc.losses.cross_entropy("out", label="y")
    with pytest.raises(ValueError, match="autocast must be one of 'bfloat16', 'float16' or None, got 'float64'"):
        gc.training.generate(model, loss, gc.optim.SGD(0.1), autocast="float64")
    with pytest.warns(UserWarning, match="autocast='float16' without loss_scale"):
        gc.training.generate(model, loss, gc.optim.SGD(0.1), autocast=torch.float16)


def test_a_model_without_lowered_ops_warns():
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["output"])], "scale",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
                              [helper.make_tensor_value_info("output", TensorProto.FLOAT, ["N", 4])],
                              [numpy_helper.from_array(np.ones(4, np.float32), "w")])
    model = gc.load(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    with pytest.warns(UserWarning, match="ran nothing in bfloat16: the model has no float32"):
        gc.training.generate(model, gc.losses.mse("output", label="y"), gc.optim.SGD(0.1), autocast="bfloat16")


def test_cli_grad_autocast(tmp_path):
    _, model, _ = _setup("cnn")
    model.save(tmp_path / "cnn.onnx")
    out = tmp_path / "arts"
    run = CliRunner().invoke(app, ["grad", str(tmp_path / "cnn.onnx"), "--loss", "cross_entropy:out:y",
                                   "--optimizer", "sgd", "--lr", "0.1", "--autocast", "bfloat16", "-o", str(out)])
    assert run.exit_code == 0, run.output
    assert "autocast bfloat16" in run.output
    assert gc.training.load(out).manifest.autocast == "bfloat16"
