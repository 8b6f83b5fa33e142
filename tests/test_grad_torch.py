"""gc.grad on models exported by torch.onnx.export matches torch.autograd (float64)."""

from __future__ import annotations

import io
import warnings

import numpy as np
import pytest

import graphc

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

try:
    from test_autodiff_rules import run_numpy
except ImportError:  # tests/ collected as a package
    from tests.test_autodiff_rules import run_numpy


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(F.relu(self.fc1(x))), y, label_smoothing=0.0)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(2, 4, 3, stride=1, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.conv2 = nn.Conv2d(4, 6, 3, stride=2, padding=1, groups=2)
        self.fc = nn.Linear(6 * 2 * 2, 3)

    def forward(self, x, t):
        h = F.max_pool2d(F.relu(self.bn(self.conv1(x))), 2)
        h = F.avg_pool2d(torch.tanh(self.conv2(h)), 1)
        out = self.fc(torch.flatten(h, 1))
        return F.mse_loss(out, t)


class TinyEncoder(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(10, 8)
        self.norm = nn.LayerNorm(8)
        self.qkv = nn.Linear(8, 24)
        self.ff = nn.Linear(8, 8)

    def forward(self, tokens, target):
        h = self.norm(self.emb(tokens))
        q, k, v = self.qkv(h).split(8, dim=-1)
        att = torch.softmax(q @ k.transpose(-2, -1) / 8 ** 0.5, dim=-1)
        h = h + F.gelu(self.ff(att @ v))
        return ((h.mean(dim=1) - target) ** 2).sum()


def export(module, args, names, dynamic, opset=18):
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, buf, input_names=names, output_names=["loss"],
                          dynamic_axes=dynamic, opset_version=opset, dynamo=False, do_constant_folding=False,
                          training=torch.onnx.TrainingMode.TRAINING)
    return graphc.load(buf.getvalue())


def torch_grads(module, args) -> dict[str, np.ndarray]:
    module.zero_grad()
    module(*args).backward()
    return {name: p.grad.numpy() for name, p in module.named_parameters()}


def check(module, make_args, names, dynamic, batches=(3,), opset=18):
    torch.manual_seed(0)
    module = module.double().train()
    model = export(module, make_args(2), names, dynamic, opset)
    grad_model = graphc.grad(model, "loss", wrt=[n for n, _ in module.named_parameters()])
    for batch in batches:
        args = make_args(batch)
        expected = torch_grads(module, args)
        feeds = {name: a.numpy() for name, a in zip(names, args)}
        out = run_numpy(grad_model.proto, feeds)
        for name, value in expected.items():
            np.testing.assert_allclose(out[f"{name}_grad"], value, rtol=1e-7, atol=1e-9, err_msg=name)


def test_mlp_cross_entropy_matches_torch_at_any_batch():
    gen = torch.Generator().manual_seed(1)

    def args(n):
        return torch.randn(n, 6, generator=gen, dtype=torch.float64), torch.randint(0, 4, (n,), generator=gen)

    check(MLP(), args, ["x", "y"], {"x": {0: "N"}, "y": {0: "N"}}, batches=(1, 3, 8))


def test_cnn_with_batchnorm_training_matches_torch():
    gen = torch.Generator().manual_seed(2)

    def args(n):
        return torch.randn(n, 2, 8, 8, generator=gen, dtype=torch.float64), \
            torch.randn(n, 3, generator=gen, dtype=torch.float64)

    check(CNN(), args, ["x", "t"], {"x": {0: "N"}, "t": {0: "N"}}, batches=(2, 5))


def test_tiny_encoder_matches_torch():
    gen = torch.Generator().manual_seed(3)

    def args(n):
        return torch.randint(0, 10, (n, 5), generator=gen), torch.randn(n, 8, generator=gen, dtype=torch.float64)

    check(TinyEncoder(), args, ["tokens", "target"], {"tokens": {0: "N"}, "target": {0: "N"}}, batches=(1, 4))


class Decoder(nn.Module):
    """Upsampling the way segmentation decoders do: bilinear (both corner conventions), bicubic
    and nearest by a whole factor, each feeding a conv."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.head = nn.Conv2d(4, 2, 1)

    def forward(self, x, t):
        h = torch.tanh(self.conv(x))
        up = F.interpolate(h, scale_factor=2, mode="bilinear", align_corners=False)
        up = up + F.interpolate(h, size=(10, 10), mode="bilinear", align_corners=True)
        up = up + F.interpolate(h, scale_factor=2, mode="bicubic", align_corners=False)
        up = up + F.interpolate(h, scale_factor=2, mode="nearest")
        return ((self.head(up) - t) ** 2).mean()


def test_interpolating_decoder_matches_torch():
    gen = torch.Generator().manual_seed(4)

    def args(n):
        return torch.randn(n, 3, 5, 5, generator=gen, dtype=torch.float64), \
            torch.randn(n, 2, 10, 10, generator=gen, dtype=torch.float64)

    check(Decoder(), args, ["x", "t"], {"x": {0: "N"}, "t": {0: "N"}}, batches=(1, 3))


def test_interpolating_decoder_trains_and_backends_agree():
    """The exported decoder (Resize scales written as Concat of Constants) trains: its
    parameters are the convs' only (scales stay settings), numpy and onnxruntime give the same
    gradients, and the loss falls."""
    torch.manual_seed(5)
    module = Decoder()
    model = export(module, (torch.randn(2, 3, 5, 5), torch.randn(2, 2, 10, 10)), ["x", "t"],
                   {"x": {0: "N"}, "t": {0: "N"}})
    arts = graphc.training.generate(model, "loss", graphc.optim.Adam(1e-2))
    assert arts.manifest.trainable == [n for n, _ in module.named_parameters()] and arts.manifest.frozen == []
    rng = np.random.default_rng(0)
    feeds = {"x": rng.random((4, 3, 5, 5), dtype=np.float32), "t": rng.random((4, 2, 10, 10), dtype=np.float32)}
    on_numpy = graphc.Session(arts.gradients, backend="numpy").run(feeds)
    on_ort = graphc.Session(arts.gradients, backend="ort-cpu").run(feeds)
    for name, value in on_numpy.items():
        np.testing.assert_allclose(on_ort[name], value, rtol=1e-4, atol=1e-5, err_msg=name)
    trainer = graphc.Trainer(arts, backend="ort-cpu")
    losses = [float(trainer.step(feeds)) for _ in range(8)]
    assert losses[-1] < 0.5 * losses[0], losses


class UNet(nn.Module):
    """A small segmentation net: strided and dilated convs, BatchNorm, ReLU6 (Clip), GELU,
    ConvTranspose and bilinear upsampling, a skip concat, SiLU, per-pixel cross-entropy and a
    ceil-mode average pool in the loss."""

    def __init__(self):
        super().__init__()
        self.e1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.e2 = nn.Sequential(nn.Conv2d(8, 16, 3, padding=1, stride=2), nn.BatchNorm2d(16), nn.ReLU6())
        self.mid = nn.Sequential(nn.Conv2d(16, 16, 3, padding=2, dilation=2), nn.GELU())
        self.up = nn.ConvTranspose2d(16, 8, 2, stride=2)
        self.dec = nn.Conv2d(16, 8, 3, padding=1)
        self.head = nn.Conv2d(8, 2, 1)

    def forward(self, x, t):
        a = self.e1(x)
        m = self.mid(self.e2(a))
        u = self.up(m) + F.interpolate(m, scale_factor=2, mode="bilinear", align_corners=False).mean(1, keepdim=True)
        logits = self.head(F.silu(self.dec(torch.cat([a, u], 1))))
        pooled = F.avg_pool2d(logits, 3, stride=2, ceil_mode=True, count_include_pad=False)
        return F.cross_entropy(logits, t) + 0.1 * pooled.abs().mean()


def test_unet_matches_torch():
    gen = torch.Generator().manual_seed(6)

    def args(n):
        return torch.randn(n, 3, 12, 12, generator=gen, dtype=torch.float64), torch.randint(0, 2, (n, 12, 12), generator=gen)

    check(UNet(), args, ["x", "t"], {"x": {0: "N"}, "t": {0: "N"}}, batches=(2,))


class Mixer(nn.Module):
    """Ops exporters emit outside the usual layers: einsum with '...', F.pad with a value, clamp
    with float bounds, cumsum, index_select, masked where, softplus, LayerNorm, and a max."""

    def __init__(self):
        super().__init__()
        self.q = nn.Linear(6, 6)
        self.k = nn.Linear(6, 6)
        self.norm = nn.LayerNorm(6)

    def forward(self, x, target):
        q, k = self.q(x), self.k(x)
        att = torch.softmax(torch.einsum("...qd,...kd->...qk", q, k) / 6 ** 0.5, dim=-1)
        h = self.norm(torch.einsum("...qk,...kd->...qd", att, x) + x)
        h = F.pad(h, (1, 2), value=0.5).clamp(-1.5, 2.0)
        h = torch.cumsum(h, dim=1).index_select(2, torch.tensor([0, 2, 3, 5]))
        h = torch.where(h > 0, F.softplus(h), h * 0.1)
        return ((h.amax(dim=1) - target) ** 2).mean()


def test_mixer_ops_match_torch():
    gen = torch.Generator().manual_seed(7)

    def args(n):
        return torch.randn(n, 5, 6, generator=gen, dtype=torch.float64), torch.randn(n, 4, generator=gen, dtype=torch.float64)

    check(Mixer(), args, ["x", "target"], {"x": {0: "N"}, "target": {0: "N"}}, batches=(1, 3))


class SdpaBlock(nn.Module):
    """A pre-norm attention block with F.scaled_dot_product_attention (causal) and a GELU MLP."""

    def __init__(self):
        super().__init__()
        self.qkv, self.out = nn.Linear(16, 48), nn.Linear(16, 16)
        self.norm, self.ff, self.head = nn.LayerNorm(16), nn.Linear(16, 16), nn.Linear(16, 4)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.norm(x)).reshape(b, t, 3, 2, 8).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, d)
        h = x + self.out(a)
        return self.head((h + F.gelu(self.ff(h))).mean(1))


def test_dynamo_exported_attention_block_runs_trains_and_deploys(tmp_path):
    """torch.onnx's current (dynamo) exporter: the block runs like torch on both backends,
    optimizes, trains (the loss falls), exports and deploys to Triton at opset 17."""
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    module = SdpaBlock()
    x = torch.randn(2, 5, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(module, (x,), dynamo=True, input_names=["x"], output_names=["logits"],
                                    dynamic_shapes={"x": {0: torch.export.Dim("N")}}, verbose=False)
    model = graphc.load(program.model_proto)
    expected = module(x).detach().numpy()
    for backend in ("numpy", "ort-cpu"):
        np.testing.assert_allclose(graphc.Session(model, backend=backend).run({"x": x.numpy()})["logits"], expected,
                                   rtol=1e-4, atol=1e-5)
    assert len(graphc.optimize(model, 3).proto.graph.node) < len(model.proto.graph.node)
    arts = graphc.training.generate(model, graphc.losses.cross_entropy("logits", label="y"), graphc.optim.AdamW(3e-3))
    trainer = graphc.Trainer(arts, backend="ort-cpu")
    rng = np.random.default_rng(0)
    batch = {"x": rng.standard_normal((32, 5, 16)).astype(np.float32), "y": rng.integers(0, 4, 32)}
    losses = [float(trainer.step(batch)) for _ in range(30)]
    assert losses[-1] < 0.7 * losses[0], losses
    trainer.export_inference(tmp_path / "block.onnx")
    folder = graphc.deploy.triton(tmp_path / "block.onnx", tmp_path / "repo", "block", max_batch_size=8)
    served = graphc.load(folder / "1" / "model.onnx")
    assert served.opset == 17
    trained = graphc.Session(graphc.load(tmp_path / "block.onnx"), backend="ort-cpu").run({"x": x.numpy()})["logits"]
    np.testing.assert_allclose(graphc.Session(served, backend="ort-cpu").run({"x": x.numpy()})["logits"], trained,
                               rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("causal", [False, True], ids=["bool_mask", "causal_and_bool_mask"])
def test_opset23_attention_op_gradients_match_torch_sdpa_with_a_fully_masked_row(causal):
    """At opset 23 torch exports scaled_dot_product_attention as ONNX Attention; it is
    differentiated through onnx's body. A query row whose mask hides every key gives 0 output
    and 0 gradient in torch, and here (not NaN from the all -inf softmax row)."""
    pytest.importorskip("onnxscript")
    import onnx_ir as ir

    from graphc.passes.autodiff import gradient_model

    class Attend(nn.Module):
        def forward(self, q, k, v, mask):
            mask = mask.tril() if causal else mask
            return (F.scaled_dot_product_attention(q, k, v, attn_mask=mask) * self.weight).sum()

    torch.manual_seed(0)
    attend = Attend()
    attend.weight = torch.randn(2, 3, 4, 5, dtype=torch.float64)
    q, k, v = (torch.randn(2, 3, 4, 5, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.tensor([[True, True, False, True], [False, False, False, False],
                         [True, True, True, True], [False, True, False, False]])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(attend, (q, k, v, mask), dynamo=True, opset_version=23, verbose=False,
                                    input_names=["q", "k", "v", "mask"], output_names=["loss"])
    assert "Attention" in {n.op_type for n in program.model_proto.graph.node}
    proto = graphc.Model(gradient_model(ir.serde.deserialize_model(program.model_proto), "loss", ["q", "k", "v"])).proto
    got = run_numpy(proto, {"q": q.detach().numpy(), "k": k.detach().numpy(), "v": v.detach().numpy(),
                            "mask": mask.numpy()})
    attend(q, k, v, mask).backward()
    for name, tensor in (("q", q), ("k", k), ("v", v)):
        np.testing.assert_allclose(got[f"{name}_grad"], tensor.grad.numpy(), rtol=1e-6, atol=1e-7, err_msg=name)
    assert np.all(got["q_grad"][:, :, 1] == 0), "the fully masked query row has no gradient"


class Samplers(nn.Module):
    """grid_sample in every mode the ONNX op has: bicubic with reflection and border padding,
    bilinear with reflection, and trilinear over a volume; grid points also far outside."""

    def forward(self, x, grid, volume, vgrid):
        a = F.grid_sample(x, grid, mode="bicubic", padding_mode="reflection", align_corners=False)
        b = F.grid_sample(x, grid * 1.3, mode="bicubic", padding_mode="border", align_corners=True)
        c = F.grid_sample(x, grid * 0.9, mode="bilinear", padding_mode="reflection", align_corners=True)
        d = F.grid_sample(volume, vgrid, mode="bilinear", padding_mode="border", align_corners=False)
        return (a * a).sum() + (b * b.sin()).sum() + (c ** 3).sum() + (d * d).sum()


def test_grid_sample_modes_gradients_match_torch():
    import onnx_ir as ir

    from graphc.passes.autodiff import gradient_model

    torch.manual_seed(0)
    inputs = {"x": torch.randn(2, 3, 5, 4, dtype=torch.float64), "grid": torch.rand(2, 3, 4, 2, dtype=torch.float64) * 4 - 2,
              "volume": torch.randn(1, 2, 3, 4, 5, dtype=torch.float64),
              "vgrid": torch.rand(1, 2, 3, 2, 3, dtype=torch.float64) * 3 - 1.5}
    for tensor in inputs.values():
        tensor.requires_grad_()
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(Samplers(), tuple(inputs.values()), buffer, dynamo=False, opset_version=20,
                          input_names=list(inputs), output_names=["loss"])
    model = graphc.load(buffer.getvalue())
    proto = graphc.Model(gradient_model(ir.serde.deserialize_model(model.proto), "loss", list(inputs))).proto
    got = run_numpy(proto, {n: t.detach().numpy() for n, t in inputs.items()})
    Samplers()(*inputs.values()).backward()
    for name, tensor in inputs.items():
        np.testing.assert_allclose(got[f"{name}_grad"], tensor.grad.numpy(), rtol=1e-7, atol=1e-10, err_msg=name)


class Paddings(nn.Module):
    """Every padding mode around a conv: reflect, replicate (edge), a crop with negative pads,
    circular (wrap), each with pads the exporter computes."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3)

    def forward(self, x):
        a = self.conv(F.pad(x, (2, 1, 1, 2), mode="reflect"))
        b = F.pad(F.pad(a, (1, 1, 0, 2), mode="replicate"), (-1, 2, 1, -1))
        c = F.pad(b, (1, 2, 2, 1), mode="circular")
        return (c * c.sin()).sum()


def _export(net, inputs: dict, dynamo: bool, opset: int = 18):
    """``net`` exported by torch.onnx's dynamo or TorchScript exporter; inputs named as given."""
    if dynamo:
        pytest.importorskip("onnxscript")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if dynamo:
            return torch.onnx.export(net, tuple(inputs.values()), dynamo=True, verbose=False,
                                     input_names=list(inputs), output_names=["loss"]).model_proto
        buffer = io.BytesIO()
        torch.onnx.export(net, tuple(inputs.values()), buffer, dynamo=False, opset_version=opset,
                          input_names=list(inputs), output_names=["loss"])
        return graphc.load(buffer.getvalue()).proto


def _check_against_torch(proto, net, inputs: dict, rtol: float = 1e-9) -> None:
    """d loss / d every input and every parameter (matched by name) equals torch.autograd's."""
    import onnx_ir as ir

    from graphc.passes.autodiff import gradient_model

    params = dict(net.named_parameters())
    wrt = [*inputs, *(t.name for t in proto.graph.initializer if t.name in params)]
    assert len(wrt) == len(inputs) + len(params), "every parameter keeps its name in the export"
    got = run_numpy(graphc.Model(gradient_model(ir.serde.deserialize_model(proto), "loss", wrt)).proto,
                    {n: t.detach().numpy() for n, t in inputs.items()})
    net(*inputs.values()).backward()
    for name in wrt:
        expected = (inputs.get(name) if name in inputs else params[name]).grad.numpy()
        np.testing.assert_allclose(got[f"{name}_grad"], expected, rtol=rtol, atol=1e-12, err_msg=name)


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_padding_modes_gradients_match_torch(dynamo):
    """TorchScript computes the pads with ConstantOfShape/Concat/Transpose/Cast chains (folded
    before autodiff so later shapes are static); dynamo writes Pad's wrap mode for circular."""
    torch.manual_seed(0)
    net = Paddings().double()
    inputs = {"x": torch.randn(2, 2, 5, 6, dtype=torch.float64, requires_grad=True)}
    proto = _export(net, inputs, dynamo, opset=19)
    modes = {a.s.decode() for n in proto.graph.node if n.op_type == "Pad" for a in n.attribute if a.name == "mode"}
    assert {"reflect", "edge", "constant"} <= modes
    _check_against_torch(proto, net, inputs)


class SubPixel(nn.Module):
    """A sub-pixel upsampler: conv, PixelShuffle (exported as DepthToSpace, which ONNX defines
    as a function only from opset 28), then PixelUnshuffle (Reshape/Transpose) and a conv."""

    def __init__(self):
        super().__init__()
        self.up, self.down = nn.Conv2d(2, 8, 3, padding=1), nn.Conv2d(18, 2, 1)

    def forward(self, x):
        y = F.pixel_unshuffle(F.pixel_shuffle(self.up(x), 2)[:, :, 1:, :], 3)
        return (self.down(y) ** 2).sum()


@pytest.mark.parametrize("dynamo", [False, True], ids=["torchscript", "dynamo"])
def test_pixel_shuffle_gradients_match_torch(dynamo):
    torch.manual_seed(0)
    net = SubPixel().double()
    inputs = {"x": torch.randn(2, 2, 5, 6, dtype=torch.float64, requires_grad=True)}
    proto = _export(net, inputs, dynamo)
    assert "DepthToSpace" in {n.op_type for n in proto.graph.node}
    _check_against_torch(proto, net, inputs)


class Regather(nn.Module):
    """Ops torch's dynamo exporter writes with GatherND or Col2Im: adaptive average pooling to
    a size that does not divide the input, nearest-exact interpolation, and nn.Fold."""

    def __init__(self):
        super().__init__()
        self.fold = nn.Fold((4, 5), 2)

    def forward(self, x, columns):
        a = F.adaptive_avg_pool2d(x, (3, 5))
        b = F.interpolate(x, size=(7, 5), mode="nearest-exact")
        return (a * a.cos()).sum() + (b ** 2).sum() + (self.fold(columns) * a.sum()).sum()


def test_gather_nd_and_col2im_gradients_match_torch():
    torch.manual_seed(0)
    inputs = {"x": torch.randn(1, 2, 7, 8, dtype=torch.float64, requires_grad=True),
              "columns": torch.randn(1, 8, 12, dtype=torch.float64, requires_grad=True)}
    proto = _export(Regather(), inputs, dynamo=True)
    assert {"GatherND", "Col2Im"} <= {n.op_type for n in proto.graph.node}
    _check_against_torch(proto, Regather(), inputs)


class Bags(nn.Module):
    """EmbeddingBag (mean): TorchScript writes a Loop over the bags whose exit condition is a
    Cast of an outer True; the dynamo exporter a Loop that counts bags while ``i < n``, with Ifs
    on the offsets and the rows appended to a sequence."""

    def __init__(self):
        super().__init__()
        self.bag = nn.EmbeddingBag(6, 3, mode="mean")

    def forward(self, x):
        return (self.bag(torch.tensor([[1, 2, 4], [4, 3, 2]])) * x).sum()


class BagsOf(nn.Module):
    """F.embedding_bag (mean) of a weight given as an input (the dynamo exporter folds a
    parameter's rows into a constant). Its export casts the rows to float32 (the sequence it
    builds has SequenceEmpty's default dtype), so it matches torch to float32 precision."""

    def forward(self, w, x):
        return (F.embedding_bag(torch.tensor([[1, 2, 4], [4, 3, 2]]), w, mode="mean") * x).sum()


@pytest.mark.parametrize("dynamo", [False, True])
def test_embedding_bag_loop_gradients_match_torch(dynamo):
    torch.manual_seed(0)
    net = BagsOf() if dynamo else Bags().double()
    inputs = {"x": torch.randn(2, 3, dtype=torch.float64, requires_grad=True)}
    if dynamo:
        inputs = {"w": torch.randn(6, 3, dtype=torch.float64, requires_grad=True), **inputs}
    proto = _export(net, inputs, dynamo=dynamo)
    assert "Loop" in {n.op_type for n in proto.graph.node}
    _check_against_torch(proto, net, inputs, rtol=1e-6 if dynamo else 1e-9)


def test_torchscript_tile_with_rank_tests_gradients_match_torch():
    """TorchScript writes torch.tile with If nodes on the input's rank (constant at export):
    folded and replaced by their taken branch, the Tile's shapes are static and it differentiates."""
    class Tiles(nn.Module):
        def forward(self, x):
            return (torch.tile(x, (1, 2)) * torch.repeat_interleave(x, 2, dim=1)).sum()

    net = Tiles()
    inputs = {"x": torch.randn(2, 3, dtype=torch.float64, requires_grad=True)}
    proto = _export(net, inputs, dynamo=False)
    assert "If" in {n.op_type for n in proto.graph.node}
    _check_against_torch(proto, net, inputs)


class TinyGPT(nn.Module):
    """Token and position embeddings, one pre-norm block with causal SDPA and a GELU MLP, and
    an LM head; logits as [N, vocab, T] (cross_entropy's class axis is 1, as in torch)."""

    def __init__(self, vocab=11, width=16, heads=2, context=6):
        super().__init__()
        self.emb, self.pos = nn.Embedding(vocab, width), nn.Parameter(torch.randn(context, width) * 0.1)
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))
        self.head, self.heads = nn.Linear(width, vocab), heads
        with torch.no_grad():  # distinct LayerNorm params: the exporter merges equal initializers
            for norm in (self.ln1, self.ln2):
                norm.weight.normal_(1.0, 0.2)
                norm.bias.normal_(0.0, 0.2)

    def forward(self, tokens):
        b, t = tokens.shape
        x = self.emb(tokens) + self.pos[:t]
        q, k, v = self.qkv(self.ln1(x)).reshape(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        x = x + self.proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, -1))
        x = x + self.ff(self.ln2(x))
        return self.head(x).transpose(1, 2)


def test_opset23_causal_gpt_block_matches_torch_trains_and_deploys(tmp_path):
    """A tiny GPT exported at opset 23 (causal SDPA as the Attention op): every parameter's
    gradient from the training artifacts equals torch.autograd's on both backends (the exporter
    renames and transposes weights: matched by value), it trains, and it deploys at opset 17."""
    pytest.importorskip("onnxscript")
    torch.manual_seed(0)
    net = TinyGPT()
    tokens, labels = torch.randint(0, 11, (3, 6)), torch.randint(0, 11, (3, 6))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        program = torch.onnx.export(net, (tokens,), dynamo=True, opset_version=23, verbose=False,
                                    input_names=["tokens"], output_names=["logits"],
                                    dynamic_shapes={"tokens": {0: torch.export.Dim("N")}})
    model = graphc.load(program.model_proto)
    assert "Attention" in {n.op_type for n in model.proto.graph.node}
    arts = graphc.training.generate(model, graphc.losses.cross_entropy("logits", label="y"), graphc.optim.AdamW(1e-2))
    F.cross_entropy(net(tokens), labels).backward()
    state = {n: arts.state[n] for n in arts.manifest.trainable}
    assert len(state) == len(list(net.parameters()))
    feeds = {"tokens": tokens.numpy(), "y": labels.numpy()}
    for backend in ("numpy", "ort-cpu"):
        grads = graphc.Session(arts.gradients, backend=backend).run(feeds)
        for name, p in net.named_parameters():
            w = p.detach().numpy()
            (ours, transposed), = [(n, w.ndim == 2 and v.shape == w.T.shape and np.array_equal(v, w.T))
                                   for n, v in state.items() if np.array_equal(v, w) or
                                   (w.ndim == 2 and v.shape == w.T.shape and np.array_equal(v, w.T))]
            got = grads[f"{ours}_grad"]
            np.testing.assert_allclose(got.T if transposed else got, p.grad.numpy(), rtol=1e-4, atol=1e-6,
                                       err_msg=f"{backend}: {name} ({ours})")
    trainer = graphc.Trainer(arts, backend="ort-cpu")
    losses = [float(trainer.step(feeds)) for _ in range(40)]
    assert losses[-1] < 0.3 * losses[0], losses
    trainer.export_inference(tmp_path / "gpt.onnx")
    folder = graphc.deploy.triton(tmp_path / "gpt.onnx", tmp_path / "repo", "gpt", max_batch_size=4)
    served = graphc.load(folder / "1" / "model.onnx")
    assert served.opset == 17 and "Attention" not in {n.op_type for n in served.proto.graph.node}
    trained = graphc.Session(graphc.load(tmp_path / "gpt.onnx"), backend="ort-cpu").run({"tokens": tokens.numpy()})
    np.testing.assert_allclose(graphc.Session(served, backend="ort-cpu").run({"tokens": tokens.numpy()})["logits"],
                               trained["logits"], rtol=1e-4, atol=1e-5)


class SpatialTransformer(nn.Module):
    """A spatial transformer: a localisation net predicts an affine map, the sampling grid is
    that map applied to the output pixel centres, and grid_sample (bilinear, zeros and border
    padding) warps the image."""

    def __init__(self):
        super().__init__()
        self.loc = nn.Linear(3 * 6 * 6, 6)
        self.conv = nn.Conv2d(3, 2, 3, padding=1)
        ys, xs = torch.meshgrid(torch.linspace(-0.8, 0.8, 5), torch.linspace(-0.8, 0.8, 5), indexing="ij")
        self.register_buffer("centres", torch.stack([xs, ys, torch.ones_like(xs)], -1).reshape(25, 3))

    def forward(self, x, t):
        identity = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], dtype=x.dtype)
        theta = self.loc(x.flatten(1)).reshape(-1, 2, 3) * 0.1 + identity
        grid = (self.centres.to(x.dtype) @ theta.transpose(1, 2)).reshape(-1, 5, 5, 2)
        warped = F.grid_sample(x, grid, mode="bilinear", padding_mode="zeros", align_corners=False)
        warped = warped + F.grid_sample(x, grid * 1.1, mode="bilinear", padding_mode="border", align_corners=True)
        return ((self.conv(warped) - t) ** 2).mean()


def test_spatial_transformer_matches_torch():
    gen = torch.Generator().manual_seed(8)

    def args(n):
        return torch.randn(n, 3, 6, 6, generator=gen, dtype=torch.float64), \
            torch.randn(n, 2, 5, 5, generator=gen, dtype=torch.float64)

    check(SpatialTransformer(), args, ["x", "t"], {}, batches=(2,))


class _Float32BatchNormNet(graphc.nn.Module):
    """A float64 network around a default (float32) BatchNorm1d: ONNX (opset 15 on) lets a
    BatchNormalization's scale, bias and statistics have another float type than its input."""

    def __init__(self):
        super().__init__()
        self.fc1 = graphc.nn.Linear(4, 6, dtype="float64")
        self.bn = graphc.nn.BatchNorm1d(6)
        self.fc2 = graphc.nn.Linear(6, 3, dtype="float64")

    def forward(self, x):
        return {"logits": self.fc2(graphc.relu(self.bn(self.fc1(x))))}


def _compare_grads(got, model, modules, names, rtol64=1e-10):
    """Each param's gradient against torch's float64 one: float32 params to float32 rounding,
    float64 ones to ``rtol64``."""
    for name in names:
        module, attr = name.split(".")
        want = getattr(modules[module], attr).grad.numpy()
        f32 = model.params[name].dtype == np.float32
        assert got[f"{name}_grad"].dtype == model.params[name].dtype
        np.testing.assert_allclose(got[f"{name}_grad"], want, rtol=1e-6 if f32 else rtol64,
                                   atol=1e-7 if f32 else 1e-12, err_msg=name)


def test_float32_batchnorm_in_a_float64_network_trains_as_torch_in_float64():
    # generate and gc.grad raised "operand dtypes differ (float vs double)", naming no node
    model = graphc.capture(_Float32BatchNormNet(), seed=0, x=graphc.spec("float64", ("N", 4)))
    assert model.params["bn.weight"].dtype == np.float32 and model.params["fc1.weight"].dtype == np.float64
    loss_spec = graphc.losses.cross_entropy("logits", label="y")
    arts = graphc.training.generate(model, loss_spec, graphc.optim.SGD(0.5))
    rng = np.random.default_rng(0)
    batch = {"x": rng.standard_normal((8, 4)), "y": rng.integers(0, 3, 8)}
    net = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6), nn.ReLU(), nn.Linear(6, 3)).double()
    modules = {"fc1": net[0], "bn": net[1], "fc2": net[3]}
    with torch.no_grad():
        for name, value in model.params.items():
            module, attr = name.split(".")
            getattr(modules[module], attr).copy_(torch.from_numpy(value.astype(np.float64)))
    x, y = torch.from_numpy(batch["x"]), torch.from_numpy(batch["y"])

    # gc.grad: the captured (inference-mode) BatchNorm, as torch's eval(); the numpy kernel
    # takes its affine coefficient scale / sqrt(var + eps) in the float32 of scale and var
    wrt = ["fc1.weight", "bn.weight", "bn.bias", "fc2.weight"]
    got = graphc.Session(graphc.grad(model, loss_spec, wrt=wrt), backend="numpy").run(batch)
    F.cross_entropy(net.eval()(x), y).backward()
    _compare_grads(got, model, modules, wrt, rtol64=1e-6)
    net.zero_grad()

    # the training graphs: batch statistics, running statistics updated in their own float32
    got = graphc.Session(arts.gradients, backend="numpy").run(batch)
    trainer = graphc.Trainer(arts, backend="numpy")
    trainer.step(batch)
    loss = F.cross_entropy(net.train()(x), y)
    loss.backward()
    assert float(got["loss"]) == pytest.approx(loss.item(), rel=1e-12)
    _compare_grads(got, model, modules, arts.manifest.trainable)
    state = trainer.state_dict()
    for stat in ("running_mean", "running_var"):
        assert state[f"bn.{stat}"].dtype == np.float32
        np.testing.assert_allclose(state[f"bn.{stat}"], getattr(net[1], stat).numpy(), rtol=1e-6, err_msg=stat)
