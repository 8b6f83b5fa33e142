"""`graphc grad`: a model's training artifacts from a loss and an optimizer given as options."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Optional

import numpy as np
import typer
from rich.markup import escape

from graphc.cli import averaging
from graphc.cli.app import OUT_ALIAS, app, chosen_output, console, output_option, validation_problem
from graphc.cli.arrays import load_npy
from graphc.cli.inspect_training import scaling_text
from graphc.cli.interrupted import wrote
from graphc.cli.paths import check_not_beside_an_input, user_path
from graphc.compile.losses import KINDS as LOSS_KINDS
from graphc.errors import did_you_mean, first_few


def _optimizer_specs() -> dict:
    from graphc.compile import optim

    return optim.BY_KIND


def _spec_defaults(field: str) -> str:
    """The optimizers' default for ``field``, for help texts, as the option takes it (``betas``:
    ``0.9,0.999``): ``0.001`` when they agree, else ``sgd 0, adam 0, adamw 0.01``."""
    def shown(value) -> str:
        if value is None:  # Adafactor's eps1
            return "none"
        return ",".join(map(shown, value)) if isinstance(value, tuple) else f"{value:g}"

    values = {kind: shown(cls.model_fields[field].default) for kind, cls in _optimizer_specs().items()
              if field in cls.model_fields}
    if len(set(values.values())) == 1:
        return next(iter(values.values()))
    return ", ".join(f"{kind} {value}" for kind, value in values.items())


def parse_loss(text: str, class_weights: Optional[str] = None):
    """``KIND:OUTPUT[:LABEL]`` -> a loss spec, e.g. ``cross_entropy:logits:y``; ``class_weights``
    (``--class-weights``: a comma list or a .npy file) the cross-entropy's class ``weight``."""
    from graphc.compile import losses

    parts = text.split(":")
    if len(parts) not in (2, 3) or not all(parts):
        raise ValueError(f"bad --loss {text!r}; expected KIND:OUTPUT[:LABEL], e.g. cross_entropy:logits:y")
    kind, output = parts[0], parts[1]
    if kind not in losses.KINDS:
        raise ValueError(f"unknown loss kind {kind!r}; choose one of {', '.join(losses.KINDS)}"
                         f"{did_you_mean(kind, losses.KINDS)}")
    label = parts[2] if len(parts) == 3 else None
    if class_weights is None:
        return getattr(losses, kind)(output, label=label)
    if kind != "cross_entropy":
        raise ValueError(f"--class-weights applies to a cross_entropy loss, not --loss {kind}")
    return losses.cross_entropy(output, label=label, weight=_class_weights(class_weights))


def _class_weights(text: str) -> np.ndarray:
    """``--class-weights``: ``1,2.5,0.5`` or a ``.npy`` file of one weight per class."""
    if text.endswith(".npy"):
        return load_npy(user_path(text), "--class-weights")
    try:
        return np.array([float(part) for part in text.split(",")])
    except ValueError:
        raise ValueError(f"--class-weights must be numbers W0,W1,... (one per class) or a .npy file, got "
                         f"{text!r}") from None


def make_optimizer(kind: str, lr: Optional[float] = None, momentum: Optional[float] = None,
                   weight_decay: Optional[float] = None, **options):
    """The optimizer spec ``kind`` with the values given (``options``: any other field of the
    specs, e.g. ``max_grad_norm``, ``betas``); one left as None keeps the spec's default (the
    CLI's defaults are the API's)."""
    specs = _optimizer_specs()
    if kind not in specs:
        raise ValueError(f"unknown --optimizer {kind!r}; choose one of {', '.join(specs)}{did_you_mean(kind, specs)}")
    given = {k: v for k, v in {"lr": lr, "momentum": momentum, "weight_decay": weight_decay, **options}.items()
             if v is not None}
    for key in given:
        if key not in specs[kind].model_fields:
            raise ValueError(f"--{key.replace('_', '-')} applies to "
                             f"{' and '.join(k for k, c in specs.items() if key in c.model_fields)}, "
                             f"not --optimizer {kind}")
    from pydantic import ValidationError

    try:
        return specs[kind](**given)
    except ValidationError as exc:
        raise ValueError("; ".join(_spec_problem(e, specs[kind]) for e in exc.errors())) from None


def _spec_problem(error: dict, spec) -> str:
    """One pydantic error of an optimizer spec said of its option(s): a check across fields, of
    the options its message names."""
    fields = [str(error["loc"][0])] if error["loc"] else [f for f in spec.model_fields
                                                          if re.search(rf"\b{f}\b", error["msg"])]
    return validation_problem(error, ", ".join(f"--{f.replace('_', '-')}" for f in fields))


@app.command("grad")
def grad_cmd(
    model: Path = typer.Argument(..., metavar="MODEL.onnx", help="The ONNX model to train."),
    loss: str = typer.Option(..., "--loss", metavar="KIND:OUTPUT[:LABEL]",
                             help=f"The loss on a model output, e.g. cross_entropy:logits:y; KIND is one of "
                             f"{', '.join(LOSS_KINDS)}; LABEL names the new label input (default: label)."),
    optimizer: str = typer.Option("sgd", "--optimizer", metavar="KIND",
                                  help="The optimizer: sgd, adam, adamw, rmsprop, adagrad, adamax, nadam, radam, "
                                  "adadelta, rprop, asgd or adafactor."),
    lr: Optional[float] = typer.Option(None, "--lr", help=f"Learning rate (default: {_spec_defaults('lr')})."),
    momentum: Optional[float] = typer.Option(None, "--momentum",
                                             help=f"SGD/RMSprop momentum (default: {_spec_defaults('momentum')})."),
    nesterov: bool = typer.Option(False, "--nesterov", help="SGD with Nesterov momentum (needs --momentum)."),
    dampening: Optional[float] = typer.Option(None, "--dampening", help="SGD's dampening of the momentum, any "
                                              f"number, as torch (default: {_spec_defaults('dampening')})."),
    amsgrad: bool = typer.Option(False, "--amsgrad", help="Adam/AdamW's AMSGrad variant (one more state slot, "
                                 "max_exp_sum_sq)."),
    maximize: bool = typer.Option(False, "--maximize", help="Maximize the loss: step along the gradient."),
    betas: Optional[str] = typer.Option(None, "--betas", metavar="B1,B2", help="Adam/AdamW/Adamax/NAdam/RAdam's "
                                        f"coefficients of the running averages (default: {_spec_defaults('betas')})."),
    eps: Optional[str] = typer.Option(None, "--eps", metavar="E|E1,E2", help="The denominator term of the adaptive "
                                      "optimizers; adafactor's two, E1,E2 (E1 none: the param dtype's epsilon) "
                                      f"(default: {_spec_defaults('eps')})."),
    alpha: Optional[float] = typer.Option(None, "--alpha", help="RMSprop's smoothing constant; ASGD's power of eta's "
                                          f"decay (default: {_spec_defaults('alpha')})."),
    rho: Optional[float] = typer.Option(None, "--rho", help="Adadelta's coefficient of the running averages "
                                        f"(default: {_spec_defaults('rho')})."),
    etas: Optional[str] = typer.Option(None, "--etas", metavar="MINUS,PLUS", help="Rprop's factors of an element's "
                                       "step size where its gradient flips sign and where it keeps it (default: "
                                       f"{_spec_defaults('etas')})."),
    step_sizes: Optional[str] = typer.Option(None, "--step-sizes", metavar="MIN,MAX", help="Rprop's bounds of the "
                                             f"step sizes (default: {_spec_defaults('step_sizes')})."),
    lambd: Optional[float] = typer.Option(None, "--lambd", help="ASGD's decay term: eta = lr / (1 + lambd*lr*t)^alpha "
                                          f"(default: {_spec_defaults('lambd')})."),
    t0: Optional[float] = typer.Option(None, "--t0", help="ASGD's step from which it averages the params "
                                       f"(default: {_spec_defaults('t0')})."),
    beta2_decay: Optional[float] = typer.Option(None, "--beta2-decay", help="Adafactor's decay of the second moment's "
                                                f"weight, 1 - t^beta2_decay (default: {_spec_defaults('beta2_decay')})."),
    d: Optional[float] = typer.Option(None, "--d", help="Adafactor's clipping threshold of the update's rms "
                                      f"(default: {_spec_defaults('d')})."),
    centered: bool = typer.Option(False, "--centered", help="Centered RMSprop: divide by the gradient's running "
                                  "variance (one more state slot, grad_avg)."),
    lr_decay: Optional[float] = typer.Option(None, "--lr-decay", help="Adagrad's lr decay: step t takes "
                                             f"lr / (1 + (t-1)*lr_decay) (default: {_spec_defaults('lr_decay')})."),
    initial_accumulator_value: Optional[float] = typer.Option(None, "--initial-accumulator-value",
                                                              help="Adagrad's first sum of squared gradients "
                                                              f"(default: {_spec_defaults('initial_accumulator_value')})."),
    momentum_decay: Optional[float] = typer.Option(None, "--momentum-decay", help="NAdam's momentum decay: step t's "
                                                   "momentum is b1*(1 - 0.5*0.96^(t*momentum_decay)) "
                                                   f"(default: {_spec_defaults('momentum_decay')})."),
    decoupled_weight_decay: bool = typer.Option(False, "--decoupled-weight-decay", help="NAdam/RAdam: decay the "
                                                "weights as AdamW (p *= 1 - lr*wd), not as L2 added to the gradient."),
    weight_decay: Optional[float] = typer.Option(None, "--weight-decay", help="Weight decay: L2 added to the "
                                                 "gradient, decoupled for adamw and with "
                                                 "--decoupled-weight-decay (default: "
                                                 f"{_spec_defaults('weight_decay')}, as PyTorch)."),
    max_grad_norm: Optional[float] = typer.Option(None, "--max-grad-norm", help="Clip the gradients' total norm "
                                                  "to this before each step, as torch.nn.utils.clip_grad_norm_ "
                                                  "(default: no clipping)."),
    grad_norm_type: Optional[str] = typer.Option(None, "--grad-norm-type", metavar="2|1|inf",
                                                 help=f"The norm --max-grad-norm clips (default: "
                                                 f"{_spec_defaults('grad_norm_type')}; only with --max-grad-norm)."),
    clip_grad_value: Optional[float] = typer.Option(None, "--clip-grad-value", help="Clamp each gradient entry to "
                                                    "[-V, V] before each step (before --max-grad-norm), as "
                                                    "torch.nn.utils.clip_grad_value_ (default: none)."),
    loss_scale: Optional[str] = typer.Option(None, "--loss-scale", metavar="dynamic|FLOAT",
                                             help="Loss scaling for float16 training: dynamic (gc.amp.GradScaler(), "
                                             "torch.amp.GradScaler's defaults: scale 65536, halved on an inf/NaN "
                                             "gradient, which skips the step, doubled after 2000 good steps) or a "
                                             "static scale (default: none)."),
    autocast: Optional[str] = typer.Option(None, "--autocast", metavar="bfloat16|float16",
                                           help="Mixed precision as torch.autocast: MatMul/Gemm/Conv/ConvTranspose/"
                                           "Einsum/PRelu run in this dtype, the ops after them on what they are "
                                           "given, the loss and the params in float32 (float16: give --loss-scale "
                                           "dynamic too; default: none)."),
    averaged: Optional[str] = typer.Option(None, "--averaged", metavar="swa|ema[:DECAY]",
                                           help="Keep an averaged copy of the weights, updated after each optimizer "
                                           "step as torch.optim.swa_utils.AveragedModel (generate's averaged=; "
                                           "graphc export --averaged writes it): swa (the running mean, "
                                           "get_swa_avg_fn), swa_multi, ema[:DECAY] (decay*avg + (1-decay)*p, "
                                           f"get_ema_avg_fn; DECAY default {averaging.ema_decay_default():g}) or "
                                           "ema_multi[:DECAY] (default: none)."),
    averaged_start: Optional[int] = typer.Option(None, "--averaged-start", min=0, metavar="N",
                                                 help="Steps before the averaging: the first update after step "
                                                 "N + --averaged-every, as torch users' swa_start (default: "
                                                 f"{averaging.model_default('start')}; only with --averaged)."),
    averaged_every: Optional[int] = typer.Option(None, "--averaged-every", min=1, metavar="N",
                                                 help="Steps between averaging updates (default: "
                                                 f"{averaging.model_default('every')}; only with --averaged)."),
    averaged_buffers: bool = typer.Option(False, "--averaged-buffers", help="Average the buffers (BatchNorm "
                                          "statistics) too, else copy them: AveragedModel's use_buffers (only "
                                          "with --averaged)."),
    class_weights: Optional[str] = typer.Option(None, "--class-weights", metavar="W0,W1,...|FILE.npy",
                                                help="A cross_entropy loss's weight of each class, as a comma "
                                                "list or a .npy file (default: none, all 1)."),
    freeze: list[str] = typer.Option([], "--freeze", metavar="PARAM", help="A param (name or glob pattern) to keep "
                                     "fixed (repeatable)."),
    param: list[str] = typer.Option([], "--param", metavar="NAME", help="An initializer (name or glob pattern) to "
                                    "train though it is an exporter constant (repeatable)."),
    batchnorm: str = typer.Option("train", "--batchnorm", metavar="train|frozen", help="train (batch statistics) or "
                                  "frozen (running statistics, not updated: fine-tuning as model.eval())."),
    recompute: bool = typer.Option(False, "--recompute", help="Recompute cheap forward values in the "
                                   "backward (activation checkpointing): less memory, a little more time."),
    device: str = typer.Option("cpu", "--device", metavar="cpu|cuda", help="Choose the backward's lowerings "
                               "for onnxruntime's CPU or CUDA provider (speed only: the numbers agree)."),
    scheduled: list[str] = typer.Option([], "--scheduled", metavar="momentum",
                                        help="A hyper-parameter to make a train_step input a schedule sets between "
                                        "steps (repeatable): momentum (SGD's/RMSprop's momentum, the Adam family's "
                                        "beta1), which graphc train --schedule onecycle or cyclic then cycles as torch "
                                        "does."),
    output: Optional[Path] = output_option("The artifact directory to write (required; made where missing, the files of "
                                           "artifacts already there replaced).", "DIR"),
    out: Optional[Path] = OUT_ALIAS,
) -> None:
    """Generate training artifacts for a model.

    Writes the train_step, gradients, eval and inference graphs, the initial state and a
    manifest into the -o directory.

    Example (Adam on the cross-entropy of the output named output, labels fed as y):

    \b
    graphc grad net.onnx --loss cross_entropy:output:y --optimizer adam -o arts
    """
    import graphc as gc
    from graphc.compile.training import ARTIFACT_FILES
    from graphc.dsl.sources import on_behalf_of

    output = chosen_output(output, out, folder=True, inputs={"MODEL.onnx": model})
    check_not_beside_an_input(output, "-o/--output", {"MODEL.onnx": model}, ARTIFACT_FILES)
    if grad_norm_type is not None and max_grad_norm is None:
        raise ValueError(f"--grad-norm-type {grad_norm_type} chooses the norm --max-grad-norm clips; give "
                         "--max-grad-norm too")
    spec = parse_loss(loss, class_weights)
    opt = make_optimizer(optimizer, lr, momentum, weight_decay, nesterov=nesterov or None,
                         betas=_pair("--betas", betas, "B1,B2", "0.9,0.999"), eps=_eps(eps, optimizer),
                         dampening=dampening, amsgrad=amsgrad or None, maximize=maximize or None, alpha=alpha,
                         centered=centered or None, lr_decay=lr_decay, initial_accumulator_value=initial_accumulator_value,
                         momentum_decay=momentum_decay, decoupled_weight_decay=decoupled_weight_decay or None,
                         rho=rho, etas=_pair("--etas", etas, "MINUS,PLUS", "0.5,1.2"), lambd=lambd, t0=t0, d=d,
                         step_sizes=_pair("--step-sizes", step_sizes, "MIN,MAX", "1e-6,50"), beta2_decay=beta2_decay,
                         max_grad_norm=max_grad_norm, grad_norm_type=_norm_type(grad_norm_type),
                         clip_grad_value=clip_grad_value)
    averaged_model = averaging.averaged_model(averaged, averaged_start, averaged_every, averaged_buffers)
    loaded = gc.load(model)
    batchnorms = _batchnorms(loaded, batchnorm)  # before generate, which may rewrite the graph
    with on_behalf_of(f"graphc grad --loss {loss}"):  # the loss's nodes' source, not typer's line that called this
        arts = gc.training.generate(loaded, spec, opt, frozen=freeze, recompute=recompute, params=param,
                                    batchnorm=batchnorm, device=device, loss_scale=_loss_scale(loss_scale),
                                    scheduled=scheduled, autocast=autocast, averaged=averaged_model)
    wrote(arts.save(output))
    m = arts.manifest
    console.print(escape(f"wrote training artifacts to {output}: {len(m.trainable)} trainable, "
                  f"{len(m.frozen)} frozen params, {len(m.constants)} exporter constants; loss {spec.kind} on "
                  f"{spec.output!r} (label input {spec.label!r}){_weighted(spec)}; optimizer {optimizer} lr={opt.lr:g}{_clipping(opt)}"
                  f"{batchnorms}{'' if m.loss_scale is None else f'; {scaling_text(m.loss_scale)}'}"
                  f"{'' if m.autocast is None else f'; autocast {m.autocast}'}{_averaged(m.averaging)}"),
                  highlight=False, soft_wrap=True)
    console.print(escape(f"trainable: {_listing(m.trainable)}"), highlight=False, soft_wrap=True)
    if m.constants:
        console.print(escape("exporter constants (not trained; --param NAME trains one): "
                             + _listing([f"{n} ({why})" for n, why in m.constants.items()])), highlight=False,
                      soft_wrap=True)


def _clipping(opt) -> str:
    """The spec's settings beyond lr that differ from its defaults (``momentum=0.9 nesterov``,
    ``betas=0.8,0.99``, ...), its gradient clipping last, for the summary line (empty: none)."""
    defaults = {name: field.default for name, field in type(opt).model_fields.items()}
    clipping = ("clip_grad_value", "max_grad_norm", "grad_norm_type")
    parts = [_setting(k, v) for k, v in opt.model_dump().items()
             if k not in ("kind", "lr", *clipping) and v != defaults[k]]
    parts += [f"clip_grad_value={opt.clip_grad_value:g}"] if opt.clip_grad_value is not None else []
    if opt.max_grad_norm is not None:
        parts.append(f"max_grad_norm={opt.max_grad_norm:g} ({str(opt.grad_norm_type).removesuffix('.0')}-norm)")
    return "".join(f" {p}" for p in parts)


def _loss_scale(text: Optional[str]):
    """``--loss-scale``: ``dynamic`` as ``gc.amp.GradScaler()``, a number as a static scale."""
    from graphc.compile.amp import GradScaler

    if text is None or text == "dynamic":
        return None if text is None else GradScaler()
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"--loss-scale must be dynamic or a number (a static scale), got {text!r}") from None


def _batchnorms(model, mode: str) -> str:
    """``; BatchNorm train`` (or ``frozen``) for the summary line of a model with BatchNorm nodes;
    for one without (an exporter folded them into the Convs) nothing, or with ``--batchnorm
    frozen`` that it changes nothing."""
    from graphc.model.inspection import op_histogram

    if op_histogram(model.ir.graph)["BatchNormalization"]:
        return f"; BatchNorm {mode}"
    return "; --batchnorm frozen: the model has no BatchNorm, nothing to freeze" if mode == "frozen" else ""


def _averaged(spec: Optional[dict]) -> str:
    """``; averaged ema decay=0.9 from step 1 (...)`` for the summary line (empty without averaging)."""
    return "" if spec is None else f"; averaged {averaging.described(spec)} (graphc export --averaged writes it)"


def _weighted(spec) -> str:
    """`` weighted by 10 classes`` for a loss given ``--class-weights`` (empty otherwise)."""
    weight = spec.options.get("weight")
    return "" if weight is None else f" weighted by {len(weight)} class weights"


def _setting(key: str, value) -> str:
    """``nesterov``, ``momentum=0.9``, ``betas=0.8,0.99``: one option as the summary line shows it."""
    if value is True:
        return key
    if isinstance(value, (tuple, list)):
        return f"{key}={','.join(f'{v:g}' if isinstance(v, float) else str(v) for v in value)}"
    return f"{key}={value:g}" if isinstance(value, float) else f"{key}={value}"


def _pair(option: str, text: Optional[str], metavar: str, example: str) -> Optional[tuple[float, float]]:
    """``--betas 0.9,0.99`` (``--etas``, ``--step-sizes``) as two numbers (the spec checks their range)."""
    if text is None:
        return None
    try:
        first, second = (float(part) for part in text.split(","))
    except ValueError:
        raise ValueError(f"{option} must be two numbers {metavar}, e.g. {example}, got {text!r}") from None
    return first, second


def _eps(text: Optional[str], kind: str) -> Optional[float | tuple[Optional[float], float]]:
    """``--eps``: one number, or adafactor's two, ``E1,E2`` (E1 ``none``: the param dtype's epsilon)."""
    if text is None:
        return None
    pair, parts = kind == "adafactor", text.split(",")
    if len(parts) != (2 if pair else 1):
        raise ValueError(f"--eps: adafactor takes two numbers E1,E2 (E1 may be none: the param dtype's epsilon), "
                         f"e.g. none,1e-3, got {text!r}" if pair else f"--eps: {kind} takes one number, got {text!r}")
    try:
        values = tuple(None if pair and i == 0 and part.strip() == "none" else float(part)
                       for i, part in enumerate(parts))
    except ValueError:
        raise ValueError(f"--eps must be numbers (E1 of adafactor's may be none), got {text!r}") from None
    return values if pair else values[0]


def _norm_type(text: Optional[str]) -> Optional[float | str]:
    """``--grad-norm-type``: ``inf`` as it is, a number as a float (the spec says which it takes)."""
    if text is None or text == "inf":
        return text
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"--grad-norm-type must be 2, 1 or inf, got {text!r}") from None


def _listing(items: list[str]) -> str:
    """The first 12 of ``items``, then how many more the manifest lists."""
    return first_few(items, 12, more=", ... ({} more; manifest.json lists all)")
