"""Tiny HuggingFace ``transformers`` architectures (random weights from configs: 2 layers,
widths 16-64) as classifiers ``logits = wrapper(*inputs)`` trained with cross-entropy, and the
audit of one through graphc: export by a torch.onnx exporter, load, inference parity (numpy,
onnxruntime, torch), training artifacts, SGD steps against ``torch.optim.SGD``. Used by
tests/test_transformers_imports.py and scripts/transformers_sweep.py; needs torch and
transformers. Dropout is 0 everywhere, so torch's train mode is deterministic."""

from __future__ import annotations

import io
import logging
import time
import warnings

import numpy as np
import onnx
import torch
import transformers as tf

import graphc as gc

CLASSES = 5
VOCAB = 40
T = 6  # sequence length
ATTN = {"attention_probs_dropout_prob": 0.0, "hidden_dropout_prob": 0.0}


class Logits(torch.nn.Module):
    """``model(**inputs)``'s logits, flattened to [rows, classes] for cross-entropy."""

    def __init__(self, model, names, field="logits"):
        super().__init__()
        self.m, self.names, self.field = model, names, field

    def forward(self, *args):
        out = self.m(**dict(zip(self.names, args)))
        logits = getattr(out, self.field)
        return logits.reshape(-1, logits.shape[-1])


def _ids(*shape):
    return lambda g: torch.randint(0, VOCAB, shape, generator=g)


def _image(size=32, batch=2):
    return lambda g: torch.randn(batch, 3, size, size, generator=g)


def _seq2seq(cls, cfg):
    return cls(cfg), ("input_ids", "decoder_input_ids"), (_ids(2, T), _ids(2, 4)), "logits"


def _text(cls, cfg):
    return cls(cfg), ("input_ids",), (_ids(2, T),), "logits"


def _vision(cls, cfg, size=32, batch=2):
    return cls(cfg), ("pixel_values",), (_image(size, batch),), "logits"


def _decoder(cls, cfg_cls, **extra):
    cfg = cfg_cls(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32,
                  attention_dropout=0.0, use_cache=False, **extra)
    return _text(cls, cfg)


ARCHS = {
    "bert": lambda: _text(tf.BertForSequenceClassification, tf.BertConfig(
        vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=32, num_labels=CLASSES, **ATTN)),
    "distilbert": lambda: _text(tf.DistilBertForSequenceClassification, tf.DistilBertConfig(
        vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=32,
        num_labels=CLASSES, dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0)),
    "gpt2": lambda: _text(tf.GPT2LMHeadModel, tf.GPT2Config(
        vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=2, n_positions=32, resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, use_cache=False)),
    "t5": lambda: _seq2seq(tf.T5ForConditionalGeneration, tf.T5Config(
        vocab_size=VOCAB, d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, dropout_rate=0.0,
        decoder_start_token_id=0, use_cache=False)),
    "bart": lambda: _seq2seq(tf.BartForConditionalGeneration, tf.BartConfig(
        vocab_size=VOCAB, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_position_embeddings=32,
        dropout=0.0, attention_dropout=0.0, activation_dropout=0.0, use_cache=False)),
    "vit": lambda: _vision(tf.ViTForImageClassification, tf.ViTConfig(
        image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, num_labels=CLASSES, **ATTN)),
    "swin": lambda: _vision(tf.SwinForImageClassification, tf.SwinConfig(
        image_size=32, patch_size=4, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4,
        num_labels=CLASSES, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, drop_path_rate=0.0)),
    "convnext": lambda: _vision(tf.ConvNextForImageClassification, tf.ConvNextConfig(
        num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], num_labels=CLASSES, drop_path_rate=0.0)),
    "resnet": lambda: _vision(tf.ResNetForImageClassification, tf.ResNetConfig(
        embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic", num_labels=CLASSES)),
    "mobilenet_v2": lambda: _vision(tf.MobileNetV2ForImageClassification, tf.MobileNetV2Config(
        depth_multiplier=0.25, image_size=64, num_labels=CLASSES, classifier_dropout_prob=0.0), 64),  # last maps 2x2
    "efficientnet": lambda: _vision(tf.EfficientNetForImageClassification, tf.EfficientNetConfig(
        image_size=32, width_coefficient=0.25, depth_coefficient=0.2, hidden_dim=320, num_labels=CLASSES,
        dropout_rate=0.0, drop_connect_rate=0.0)),
    "clip_vision": lambda: (tf.CLIPVisionModelWithProjection(tf.CLIPVisionConfig(
        image_size=32, patch_size=8, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=2, projection_dim=CLASSES, attention_dropout=0.0)),
        ("pixel_values",), (_image(),), "image_embeds"),
    "whisper_encoder": lambda: (tf.WhisperForAudioClassification(tf.WhisperConfig(
        d_model=32, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=64, num_mel_bins=8,
        max_source_positions=8, num_labels=CLASSES, classifier_proj_size=16, dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0)),
        ("input_features",), (lambda g: torch.randn(2, 8, 16, generator=g),), "logits"),
    "wav2vec2": lambda: (tf.Wav2Vec2ForSequenceClassification(tf.Wav2Vec2Config(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2, num_labels=CLASSES, classifier_proj_size=16, hidden_dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
        layerdrop=0.0, mask_time_prob=0.0, do_stable_layer_norm=False)),
        ("input_values",), (lambda g: torch.randn(2, 400, generator=g),), "logits"),
    "hubert": lambda: (tf.HubertForSequenceClassification(tf.HubertConfig(
        hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
        conv_dim=(16, 16), conv_stride=(5, 2), conv_kernel=(10, 3), num_conv_pos_embeddings=8,
        num_conv_pos_embedding_groups=2, num_labels=CLASSES, classifier_proj_size=16, hidden_dropout=0.0,
        attention_dropout=0.0, activation_dropout=0.0, feat_proj_dropout=0.0, final_dropout=0.0,
        layerdrop=0.0, mask_time_prob=0.0)),
        ("input_values",), (lambda g: torch.randn(2, 400, generator=g),), "logits"),
    "llama": lambda: _decoder(tf.LlamaForCausalLM, tf.LlamaConfig),
    "mistral": lambda: _decoder(tf.MistralForCausalLM, tf.MistralConfig, sliding_window=None),
    "mamba": lambda: _text(tf.MambaForCausalLM, tf.MambaConfig(
        vocab_size=VOCAB, hidden_size=32, state_size=8, num_hidden_layers=2, expand=2, conv_kernel=4,
        use_cache=False, use_mambapy=False)),
    "rwkv": lambda: _text(tf.RwkvForCausalLM, tf.RwkvConfig(
        vocab_size=VOCAB, hidden_size=32, attention_hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        context_length=16, use_cache=False)),
}
EXPORTERS = ("torchscript", "dynamo")


def build(name: str, seed: int = 0):
    """(wrapper in train mode, example inputs, labels) for ``name``; the same for a seed."""
    torch.manual_seed(seed)
    model, names, makers, field = ARCHS[name]()
    model.config.use_cache = False
    with torch.no_grad():  # norms as after training: distinct values (dynamo would merge equal ones)
        for sub in model.modules():
            for attr in ("weight", "bias"):
                p = getattr(sub, attr, None)
                if isinstance(p, torch.nn.Parameter) and p.ndim == 1 and bool((p == p.flatten()[0]).all()):
                    p.uniform_(0.5, 1.5) if attr == "weight" else p.uniform_(-0.5, 0.5)
            if isinstance(sub, torch.nn.modules.batchnorm._BatchNorm):
                sub.running_mean.uniform_(-0.2, 0.2)
                sub.running_var.uniform_(0.5, 1.5)
    wrapper = Logits(model, names, field).train()
    gen = torch.Generator().manual_seed(seed)
    inputs = tuple(make(gen) for make in makers)
    rows = wrapper.eval()(*inputs).shape[0]
    wrapper.train()
    return wrapper, inputs, torch.randint(0, CLASSES, (rows,), generator=gen)


def input_names(wrapper) -> tuple:
    return tuple(wrapper.names)


def export(wrapper, inputs, exporter: str) -> onnx.ModelProto:
    """``wrapper`` in eval mode exported with output ``logits``: TorchScript at opset 17 without
    constant folding (it folds BatchNorm into the Conv before it), dynamo with ``optimize=False``
    for the same reason."""
    wrapper.eval()
    names = list(input_names(wrapper))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            logging.getLogger("onnxscript").setLevel(logging.ERROR)
            if exporter == "dynamo":
                return torch.onnx.export(wrapper, inputs, dynamo=True, optimize=False, verbose=False,
                                         input_names=names, output_names=["logits"]).model_proto
            buffer = io.BytesIO()
            torch.onnx.export(wrapper, inputs, buffer, dynamo=False, opset_version=17, input_names=names,
                              output_names=["logits"], do_constant_folding=False)
            return onnx.load_from_string(buffer.getvalue())
    finally:
        wrapper.train()


def torch_names(wrapper) -> dict:
    """Each name of a trainable parameter (tied ones have several: GPT-2's ``lm_head.weight``
    is ``transformer.wte.weight``) to its ``named_parameters()`` name."""
    first = {id(p): n for n, p in wrapper.named_parameters()}
    return {n: first[id(p)] for n, p in wrapper.named_parameters(remove_duplicate=False) if p.requires_grad}


def untrained(wrapper, exporter: str) -> set:
    """What a user passes as ``frozen``: the parameters torch does not train (Whisper's
    sinusoidal ``embed_positions``, ``requires_grad=False``: neither exporter records that) and,
    for TorchScript, the float buffers it cannot tell from parameters (BART's
    ``final_logits_bias``) less BatchNorm statistics, which graphc recognises."""
    stats = ("running_mean", "running_var", "num_batches_tracked")
    out = {n for n, p in wrapper.named_parameters(remove_duplicate=False) if not p.requires_grad}
    if exporter == "torchscript":
        out |= {n for n, b in wrapper.named_buffers() if b.is_floating_point() and not n.endswith(stats)}
    return out


def torch_sgd(wrapper, inputs, y, steps: int, lr: float) -> tuple:
    """(losses, params after ``steps`` SGD steps, first gradients) of torch in train mode; the
    parameters the loss does not read (Whisper's unused decoder side) have no gradient."""
    params = dict(wrapper.named_parameters())
    opt = torch.optim.SGD(params.values(), lr=lr)
    losses, first = [], None
    for _ in range(steps):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(wrapper(*inputs), y)
        loss.backward()
        first = first or {n: p.grad.detach().numpy().copy() for n, p in params.items() if p.grad is not None}
        opt.step()
        losses.append(loss.item())
    return losses, {n: p.detach().numpy().copy() for n, p in params.items()}, first


def rel(a, b) -> float:
    """max |a - b| over max |b| (0 when both are 0)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))


def scaled_error(got: dict, want: dict) -> float:
    """The largest difference over the largest value of all of ``want`` (not each tensor's own:
    a key bias's gradient is 0 up to rounding, softmax being shift invariant)."""
    scale = max(float(np.abs(w).max()) for w in want.values())
    return max(float(np.abs(np.asarray(got[n], np.float64) - want[n]).max()) for n in want) / max(scale, 1e-30)


def audit(name: str, exporter: str, steps: int = 3, lr: float = 1e-3, row: dict | None = None) -> dict:
    """One row of the table, filled into ``row``; raises at the first stage that fails, with
    its name left in ``row["stage"]``."""
    import copy

    row = {} if row is None else row
    row.update(arch=name, exporter=exporter, stage="build")
    wrapper, inputs, y = build(name)
    fresh = copy.deepcopy(wrapper)
    for sub in fresh.modules():  # an ONNX attribute holds a float32: eps=1e-3 is 1.0000000475e-3, which
        for attr in ("eps", "variance_epsilon"):  # BatchNorm over 2x2 maps amplifies to 1e-4 in gradients
            if isinstance(getattr(sub, attr, None), float):
                setattr(sub, attr, float(np.float32(getattr(sub, attr))))
    feeds = {n: t.numpy() for n, t in zip(input_names(wrapper), inputs)}
    row["stage"] = "export"
    proto = export(wrapper, inputs, exporter)
    with torch.no_grad():
        expected = wrapper.eval()(*inputs).numpy()
    wrapper.train()
    losses, after, grads = torch_sgd(fresh, inputs, y, steps, lr)

    row["stage"] = "load"
    model = gc.load(proto)
    row["stage"] = "infer"
    for backend in ("numpy", "ort-cpu"):
        got = gc.Session(model, backend=backend).run(feeds)["logits"]
        row[f"infer_{backend}"] = rel(got, expected)
    row["stage"] = "generate"
    names = torch_names(wrapper)
    frozen = sorted(set(model.params) & untrained(wrapper, exporter))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        arts = gc.training.generate(model, gc.losses.cross_entropy("logits", label="y"), gc.optim.SGD(lr),
                                    frozen=frozen)
    row["warnings"] = [str(w.message) for w in caught]
    row["frozen"] = frozen
    names = {n: t for n, t in names.items() if t in grads}  # what the loss reads
    trained = sorted(names.get(n, n) for n in arts.manifest.trainable)
    row["trainable_ok"] = trained == sorted(set(names.values()))
    row["trainable_diff"] = sorted(set(trained) ^ set(names.values()))
    row["stage"] = "check"
    for graph in arts.graphs.values():
        onnx.checker.check_model(graph.proto, full_check=True)
    row["stage"] = "train"
    batch = {**feeds, "y": y.numpy()}
    got = gc.Session(arts.gradients, backend="ort-cpu").run(batch)
    shared = {n: names[n] for n in arts.manifest.trainable if n in names}  # graphc's name: torch's
    row["grad"] = scaled_error({t: got[f"{n}_grad"] for n, t in shared.items()}, {t: grads[t] for t in shared.values()})
    trainer = gc.Trainer(arts, backend="ort-cpu")
    ours = [trainer.step(batch)]
    start = time.perf_counter()
    ours += [trainer.step(batch) for _ in range(steps - 1)]
    row["step_ms"] = 1e3 * (time.perf_counter() - start) / max(steps - 1, 1)
    row["loss"] = rel(ours, losses)
    params = trainer.params  # the update (new - initial) against torch's, where the error shows
    row["update"] = scaled_error({t: params[n] - arts.state[n] for n, t in shared.items()},
                                 {t: after[t] - arts.state[n] for n, t in shared.items()})
    row["stage"] = "done"
    return row
