"""The CLI's vocabulary and help (issue 15, item 1) and its defaults against the API's
(item 2): every option of every command is either compared with the API parameter it feeds
(``inspect.signature``) or listed as CLI-only with the reason, so a new option or a changed
default anywhere fails here until the two agree."""

import inspect
import io
import json
import re
import subprocess
import sys

import onnx
import pytest
import typer

import graphc as gc
from graphc.runtime.distributed import DistributedTrainer, map_batches
from graphc.cli import app
from graphc.cli.grad_cmds import make_optimizer
from graphc.cli.demo import run_demo
from graphc.compile.export import export_inference
from graphc.runtime.feeds import random_feeds

from cli_util import one_line_error, run_cli
from trainer_models import imported_mlp


def _commands(group=None, prefix=()):
    """(command path, click command) for every leaf command."""
    group = group or typer.main.get_command(app)
    for name, cmd in group.commands.items():
        if hasattr(cmd, "commands"):
            yield from _commands(cmd, (*prefix, name))
        else:
            yield " ".join((*prefix, name)), cmd


COMMANDS = dict(_commands())
GROUPS = sorted({path.rsplit(" ", 1)[0] for path in COMMANDS if " " in path})

# (command, parameter) -> (API callable, its parameter) that the option's value is passed to.
API_DEFAULTS = {
    ("train", "patience"): (gc.optim.lr_scheduler.ReduceLROnPlateau, "patience"),
    ("capture", "opset"): (gc.capture, "opset"),
    ("capture", "training"): (gc.capture, "training"),
    ("capture", "name"): (gc.capture, "name"),
    ("optimize", "level"): (gc.optimize, "level"),
    ("optimize", "keep_io_types"): (gc.convert_float, "keep_io_types"),
    ("grad", "freeze"): (gc.training.generate, "frozen"),
    ("grad", "recompute"): (gc.training.generate, "recompute"),
    ("grad", "param"): (gc.training.generate, "params"),
    ("grad", "batchnorm"): (gc.training.generate, "batchnorm"),
    ("grad", "device"): (gc.training.generate, "device"),
    ("grad", "loss_scale"): (gc.training.generate, "loss_scale"),
    ("grad", "scheduled"): (gc.training.generate, "scheduled"),
    ("grad", "autocast"): (gc.training.generate, "autocast"),
    ("grad", "averaged"): (gc.training.generate, "averaged"),
    ("grad", "averaged_buffers"): (gc.optim.swa_utils.AveragedModel.__init__, "use_buffers"),
    ("run", "backend"): (gc.Session, "backend"),
    ("run", "batch_size"): (map_batches, "batch_size"),
    ("parity", "backends"): (gc.parity.compare, "backends"),
    ("parity", "rtol"): (gc.parity.compare, "rtol"),
    ("parity", "atol"): (gc.parity.compare, "atol"),
    ("parity", "bisect"): (gc.parity.compare, "bisect"),
    ("parity", "seed"): (random_feeds, "seed"),
    ("train", "backend"): (gc.Trainer.__init__, "backend"),
    ("train", "seed"): (gc.Trainer.__init__, "seed"),
    ("train", "tensorboard"): (gc.Trainer.__init__, "tensorboard"),
    ("train", "workers"): (gc.Trainer.__init__, "workers"),
    ("train", "accumulate"): (gc.Trainer.__init__, "accumulate"),
    ("train", "shard_optimizer"): (DistributedTrainer.__init__, "shard_optimizer"),
    ("train", "ray_address"): (gc.Trainer.__init__, "ray_address"),
    ("train", "placement"): (DistributedTrainer.__init__, "placement"),
    ("train", "progress"): (gc.Trainer.fit, "progress"),
    ("train", "plot"): (gc.Trainer.fit, "plot"),
    ("train", "checkpoint"): (gc.Trainer.fit, "checkpoint"),
    ("train", "checkpoint_every"): (gc.Trainer.fit, "checkpoint_every"),
    ("train", "quiet"): (gc.Trainer.fit, "quiet"),
    ("train", "log"): (gc.Trainer.fit, "log"),
    ("train", "changed_optimizer"): (gc.Trainer.load_checkpoint, "changed_optimizer"),
    ("train", "fresh_optimizer"): (gc.Trainer.load_checkpoint, "fresh_optimizer"),
    ("train", "changed_model"): (gc.Trainer.load_checkpoint, "changed_model"),
    ("export", "opset"): (export_inference, "opset"),
    ("export", "allow_untrained"): (export_inference, "allow_untrained"),
    ("export", "dtype"): (export_inference, "dtype"),
    ("export", "keep_io_types"): (export_inference, "keep_io_types"),
    ("export", "allow_uncalibrated"): (export_inference, "allow_uncalibrated"),
    ("export", "averaged"): (export_inference, "averaged"),
    ("deploy triton", "max_batch_size"): (gc.deploy.triton, "max_batch_size"),
    ("deploy triton", "dtype"): (gc.deploy.triton, "dtype"),
    ("deploy triton", "keep_io_types"): (gc.deploy.triton, "keep_io_types"),
    ("deploy triton", "dynamic_batching"): (gc.deploy.triton, "dynamic_batching"),
    ("deploy triton", "opset"): (gc.deploy.triton, "opset"),
    ("deploy triton", "allow_uncalibrated"): (gc.deploy.triton, "allow_uncalibrated"),
    ("serve", "host"): (gc.serve, "host"),
    ("serve", "port"): (gc.serve, "port"),
    ("serve", "backend"): (gc.serve, "backend"),
    ("serve", "name"): (gc.serve, "name"),
    ("serve", "allow_unchecked"): (gc.serve, "allow_unchecked"),
    ("serve", "allow_uncalibrated"): (gc.serve, "allow_uncalibrated"),
    ("demo", "backend"): (run_demo, "backend"),
    ("demo", "epochs"): (run_demo, "epochs"),
    ("demo", "progress"): (run_demo, "progress"),
    ("demo", "seed"): (run_demo, "seed"),
}

# Options whose CLI default is None: "the API's own default" (checked below where the CLI
# resolves it), or an option the API has no parameter for.
CLI_ONLY = {
    ("capture", "seed"): "0: gc.capture(seed=None) draws from gc.manual_seed's seed, 0 in a fresh process as the CLI's",
    ("train", "schedule"): "none: no scheduler, as fit(scheduler=None); the names build graphc.cli.schedules' recipes",
    ("train", "schedule_interval"): "None: epoch, fit's default, or step for onecycle",
    ("train", "step_size"): "None: StepLR has no default step_size either; required by --schedule step",
    ("train", "gamma"): "None: StepLR's and ReduceLROnPlateau's 0.1 (factor); ExponentialLR has none",
    ("train", "min_lr"): "None: CosineAnnealingLR's eta_min 0, ReduceLROnPlateau's min_lr 0",
    ("train", "warmup"): "0: no LinearLR warmup before the schedule",
    ("optimize", "dtype"): "None: keep float32; a dtype is gc.convert_float's, applied after gc.optimize",
    ("grad", "optimizer"): "the API has no default optimizer; sgd, whose own defaults follow",
    ("grad", "lr"): "None: the optimizer spec's default (test_grad_optimizer_defaults_are_the_specs)",
    ("grad", "momentum"): "None: the optimizer spec's default",
    ("grad", "nesterov"): "False: the SGD spec's nesterov left out, its default off",
    ("grad", "betas"): "None: the Adam spec's default",
    ("grad", "eps"): "None: the optimizer spec's default (adafactor's the pair none,1e-3)",
    ("grad", "weight_decay"): "None: the optimizer spec's default",
    ("grad", "max_grad_norm"): "None: the optimizer spec's default (no clipping)",
    ("grad", "grad_norm_type"): "None: the optimizer spec's default (2)",
    ("grad", "dampening"): "None: the SGD spec's default (0)",
    ("grad", "amsgrad"): "False: the Adam spec's amsgrad left out, its default off",
    ("grad", "maximize"): "False: the optimizer spec's maximize left out, its default off",
    ("grad", "alpha"): "None: the RMSprop spec's default (0.99), the ASGD spec's (0.75)",
    ("grad", "rho"): "None: the Adadelta spec's default (0.9)",
    ("grad", "etas"): "None: the Rprop spec's default (0.5,1.2)",
    ("grad", "step_sizes"): "None: the Rprop spec's default (1e-6,50)",
    ("grad", "lambd"): "None: the ASGD spec's default (1e-4)",
    ("grad", "t0"): "None: the ASGD spec's default (1e6)",
    ("grad", "beta2_decay"): "None: the Adafactor spec's default (-0.8)",
    ("grad", "d"): "None: the Adafactor spec's default (1)",
    ("grad", "centered"): "False: the RMSprop spec's centered left out, its default off",
    ("grad", "lr_decay"): "None: the Adagrad spec's default (0)",
    ("grad", "initial_accumulator_value"): "None: the Adagrad spec's default (0)",
    ("grad", "momentum_decay"): "None: the NAdam spec's default (0.004)",
    ("grad", "decoupled_weight_decay"): "False: the NAdam/RAdam spec's decoupled_weight_decay left out, its default off",
    ("grad", "averaged_start"): "None: AveragedModel's start (0); given without --averaged, an error",
    ("grad", "averaged_every"): "None: AveragedModel's every (1); given without --averaged, an error",
    ("grad", "class_weights"): "None: cross_entropy's weight=None, every class weighing 1",
    ("grad", "clip_grad_value"): "None: the optimizer spec's default (no clipping)",
    ("optimize", "report"): "printing only",
    ("run", "threads"): "None: onnxruntime's own thread count (Session options)",
    ("train", "resume"): "CLI flow: load_checkpoint before fit",
    ("train", "eval_data"): "which file the evaluation arrays come from",
    ("train", "metrics"): "none given: the loss kind's defaults (Trainer(metrics=None))",
    ("train", "cuda_graph"): "False: the Trainer's cuda_graph option (**options) left out, its default off",
    ("inspect", "dims"): "sizes for the estimate; none given: every dim name counts as 1",
    ("parity", "inputs"): "feeds; none given: random_feeds",
    ("parity", "dims"): "random_feeds dims; none given: its default",
    **{(c, "as_json"): "output form: tables, or one JSON document" for c in ("backends", "inspect", "parity", "train")},
    ("run", "inputs"): "feeds",
    **{(c, "output"): "required (chosen_output refuses None)" for c in ("capture", "optimize", "grad", "export")},
    ("run", "output"): "None: print the outputs",
    ("run", "workers"): "1: one Session in this process (map_batches' None would use every CPU of the cluster)",
    ("view", "output"): "None: netron when installed, else MODEL.html in the current directory",
    ("demo", "output"): "None: run_demo's out (test_demo_output_default_is_run_demos)",
    ("deploy triton", "gpu"): "instance='gpu' if given else 'cpu' (test_deploy_gpu_flag_default_is_cpu)",
    ("serve", "threads"): "None: onnxruntime's own thread count (session options)",
    ("serve", "max_body_bytes"): "None: serve's own max_body_bytes",
    ("serve", "max_json_bytes"): "None: serve's own max_json_bytes",
    ("serve", "read_timeout"): "None: serve's own read_timeout",
    ("serve", "max_queue"): "None: serve's own max_queue",
    ("serve", "max_reply_bytes"): "None: serve's own max_reply_bytes",
    ("serve", "max_tensor_bytes"): "None: serve's own max_tensor_bytes",
    ("serve", "max_request_bytes"): "None: serve's own max_request_bytes",
    ("serve", "max_inflight_bytes"): "None: serve's own max_inflight_bytes (4 x max_body_bytes)",
    ("serve", "request_timeout"): "None: serve's own request_timeout (120 s); 0 there is None, no limit",
}


def _params(cmd):
    return [p for p in cmd.params if not getattr(p, "hidden", False) and p.param_type_name == "option"]


def _normalize(value):
    if isinstance(value, str) and "," in value:
        return tuple(v.strip() for v in value.split(","))
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return value


def test_every_option_default_is_the_apis_or_says_why_not():
    unclassified = []
    for path, cmd in COMMANDS.items():
        for param in _params(cmd):
            key = (path, param.name)
            if param.required or key in CLI_ONLY:
                continue
            if key not in API_DEFAULTS:
                unclassified.append(f"{path} {param.opts[0]}")
                continue
            fn, name = API_DEFAULTS[key]
            api_default = inspect.signature(fn).parameters[name].default
            assert _normalize(param.default) == _normalize(api_default), (
                f"graphc {path} {param.opts[0]} defaults to {param.default!r}, "
                f"{getattr(fn, '__qualname__', fn)}({name}=...) to {api_default!r}")
    assert not unclassified, ("options with no API counterpart listed in API_DEFAULTS or CLI_ONLY "
                              f"(tests/test_cli_options.py): {unclassified}")


def test_every_classified_option_exists():
    """A classification left behind by a renamed or removed option (or written before its option)
    would check nothing."""
    options = {(path, param.name) for path, cmd in COMMANDS.items() for param in _params(cmd)}
    assert sorted(set(API_DEFAULTS) - options) == [] and sorted(set(CLI_ONLY) - options) == []


@pytest.mark.parametrize("kind", ["sgd", "adam", "adamw"])
def test_grad_optimizer_defaults_are_the_specs(kind):
    spec = {"sgd": gc.optim.SGD, "adam": gc.optim.Adam, "adamw": gc.optim.AdamW}[kind]()
    assert make_optimizer(kind) == spec  # --lr, --momentum, --weight-decay left out
    assert make_optimizer("adamw").weight_decay == 0.01  # as torch.optim.AdamW


def test_grad_momentum_with_adam_is_an_error():
    with pytest.raises(ValueError, match="--momentum applies to sgd"):
        make_optimizer("adam", momentum=0.9)


@pytest.mark.parametrize("flags, message", [
    (["--lr", "inf"], "error: ValueError: --lr: lr must be a finite number for SGD, got inf: graphc refuses inf and "
     "NaN, which torch takes in places (its step then turns params to inf or NaN, or stops them)"),
    (["--optimizer", "adam", "--weight-decay", "-1"],
     "error: ValueError: --weight-decay: weight_decay must be >= 0, as torch.optim.Adam checks it, got -1.0"),
    (["--nesterov", "--dampening", "0.1"], "error: ValueError: --momentum, --nesterov, --dampening: SGD(nesterov=True) "
     "needs momentum > 0 and dampening 0 (as in torch.optim.SGD), got momentum=0.0, dampening=0.1"),
    (["--max-grad-norm", "1", "--grad-norm-type", "3"], "error: ValueError: --grad-norm-type: grad_norm_type must be "
     "2.0, 1.0 or 'inf' (float('inf')), got 3.0"),
    (["--optimizer", "adam", "--betas", "1,0.5"], "error: ValueError: --betas: betas must each lie in [0, 1), as "
     "torch.optim.Adam checks them, got (1.0, 0.5)"),
])
def test_a_bad_optimizer_option_is_one_line_naming_the_option(capsys, tmp_path, flags, message):
    """pydantic's own report (several lines and a link) once reached the terminal as it was, then
    its field names and ``value: Value error,`` prefix."""
    onnx.save(imported_mlp(), tmp_path / "mlp.onnx")
    result = run_cli(capsys, "grad", tmp_path / "mlp.onnx", "--loss", "cross_entropy:logits:y", "-o",
                     tmp_path / "arts", *flags)
    assert one_line_error(result).strip() == message
    assert not (tmp_path / "arts").exists()


def test_a_validation_error_no_command_words_is_one_line_without_pydantics_prefix():
    from pydantic import ValidationError

    from graphc.cli import _one_line

    with pytest.raises(ValidationError) as across:
        gc.optim.SGD(nesterov=True)
    assert _one_line(across.value) == ("invalid SGD: SGD(nesterov=True) needs momentum > 0 and dampening 0 (as in "
                                       "torch.optim.SGD), got momentum=0.0, dampening=0.0")
    with pytest.raises(ValidationError) as field:
        gc.optim.SGD(lr=-1)
    assert _one_line(field.value) == "invalid SGD: lr: lr must be >= 0, as torch.optim.SGD checks it, got -1.0"


def test_demo_output_default_is_run_demos():
    cli_help = COMMANDS["demo"].params
    output = next(p for p in cli_help if p.name == "output")
    assert f"default: {inspect.signature(run_demo).parameters['out'].default}" in output.help


def test_deploy_gpu_flag_default_is_cpu():
    gpu = next(p for p in COMMANDS["deploy triton"].params if p.name == "gpu")
    assert gpu.default is False and inspect.signature(gc.deploy.triton).parameters["instance"].default == "cpu"


def test_every_option_has_help_and_no_rst_markup():
    for path, cmd in COMMANDS.items():
        assert cmd.help and "``" not in cmd.help, path
        for param in cmd.params:
            if getattr(param, "hidden", False):
                continue
            assert param.help and param.help.strip(), f"graphc {path}: {param.name} has no help text"
            assert "``" not in param.help, f"graphc {path}: {param.name} help has RST markup"


def test_loss_help_lists_the_loss_kinds():
    loss = next(p for p in COMMANDS["grad"].params if p.name == "loss")
    assert all(kind in loss.help for kind in gc.losses.KINDS)


@pytest.mark.parametrize("command", [None, *COMMANDS])
def test_help_at_80_columns_has_no_value_placeholder_on_flags(capsys, monkeypatch, command):
    monkeypatch.setenv("COLUMNS", "80")
    r = run_cli(capsys, *(command.split() if command else []), "--help")
    assert r.code == 0, r.err
    assert "<bool>" not in r.out and "``" not in r.out
    assert max(len(line) for line in r.out.splitlines()) <= 80
    if command is None:
        assert "--debug / --no-debug" in r.out


TYPE_PLACEHOLDER = re.compile(r"<[a-z][a-z \[\],|]*>")  # typer's <int range>, <str>, <float>, <path>, <list[str]>


@pytest.mark.parametrize("command", [None, *GROUPS, *COMMANDS])
def test_help_names_values_by_words_not_type_placeholders(capsys, command):
    """``--epochs N``, ``-b, --backend NAME``, ``graphc train [OPTIONS] ARTIFACT_DIR``: not typer's
    ``--epochs <int range>``, ``{ARTIFACT_DIR}`` in the usage line, ``ARTIFACT_DIR <path>``."""
    r = run_cli(capsys, *(command.split() if command else []), "--help")
    assert r.code == 0, r.err
    assert not TYPE_PLACEHOLDER.findall(r.out), r.out
    usage = r.out.splitlines()[0]
    assert usage.startswith("Usage: graphc") and "{" not in usage and "}" not in usage, usage


def test_help_value_words_by_type_and_explicit_metavars_kept(capsys):
    train = run_cli(capsys, "train", "--help").out
    assert train.startswith("Usage: graphc train [OPTIONS] ARTIFACT_DIR\n")
    for shown in ("  ARTIFACT_DIR  Artifact directory", "--epochs N ", "-b, --backend NAME ", "--gamma X ",
                  "--data FILE.npz ", "--checkpoint DIR ", "--ray-address ADDRESS "):
        assert shown in train, shown
    assert "--max-body-bytes N " in run_cli(capsys, "serve", "--help").out


def test_optimize_level_help_fits_a_terminal(capsys, monkeypatch):
    """``graphc optimize --help`` says what each level adds, a line or two each at 80 columns (it
    listed every pass: 38 lines); docs/api.md's "Optimization levels" names the passes."""
    monkeypatch.setenv("COLUMNS", "80")
    out = run_cli(capsys, "optimize", "--help").out
    start = out.index("-O, --level N")
    level = out[start:out.index("  --report", start)].splitlines()
    assert len(level) <= 15, "\n".join(level)
    assert all(f"{n}:" in " ".join(level) for n in range(4))


WRITERS = ["capture", "optimize", "grad", "run", "export", "demo", "view"]


@pytest.mark.parametrize("command", WRITERS)
def test_output_is_dash_o_or_output_with_hidden_out_alias(command):
    cmd = COMMANDS[command]
    output = next(p for p in cmd.params if p.name == "output")
    assert output.opts == ["-o", "--output"]
    alias = next(p for p in cmd.params if p.name == "out")
    assert alias.opts == ["--out"] and alias.hidden


def test_out_alias_works_and_two_different_outputs_are_an_error(capsys, tmp_path):
    onnx.save(imported_mlp(), tmp_path / "mlp.onnx")
    r = run_cli(capsys, "optimize", tmp_path / "mlp.onnx", "--out", tmp_path / "a.onnx")
    assert r.code == 0, r.err
    assert (tmp_path / "a.onnx").is_file()
    err = one_line_error(run_cli(capsys, "optimize", tmp_path / "mlp.onnx", "-o", tmp_path / "b.onnx",
                                 "--out", tmp_path / "c.onnx"))
    assert "--out is an alias of --output" in err
    assert not (tmp_path / "b.onnx").exists() and not (tmp_path / "c.onnx").exists()
    assert "missing option -o/--output" in one_line_error(run_cli(capsys, "optimize", tmp_path / "mlp.onnx"))


def test_parity_table_is_readable_at_80_columns(monkeypatch):
    from rich.console import Console

    from graphc.cli.run_cmds import parity_table
    from graphc.runtime.parity import OutputDiff, ParityReport

    bad = OutputDiff(name="logits_output", backend="ort-cpu", dtype="float32", shape=(64, 1000),
                     max_abs_err=3.8147e-06, max_rel_err=1.2345e-3, mismatched=3, rtol=1e-4, atol=1e-5, ok=False,
                     note="3 elements outside the tolerance")
    report = ParityReport(backends=["numpy", "ort-cpu"], outputs={bad.name: bad}, details=[bad])
    console = Console(width=80, file=io.StringIO(), color_system=None)
    console.print(parity_table(["numpy", "ort-cpu"], report))
    text = console.file.getvalue()
    assert "…" not in text
    for figure in ("3.81e-06", "0.00123", "0.0001", "1e-05", "FAIL", "float32[64, 1000]", "logits_output"):
        assert figure in text, (figure, text)
    assert max(len(line) for line in text.splitlines()) <= 80


def test_grad_option_defaults_in_help_come_from_the_optimizer_specs():
    """Every optimizer option's "(default: X)" is the specs' default, read from them: with each spec
    default changed before the CLI is imported, the help says the changed value (hand-typed
    defaults for --betas, --alpha, ... kept saying 0.9,0.999, 0.99, ...)."""
    changed = {"lr": 0.125, "momentum": 0.25, "dampening": 0.375, "betas": (0.5, 0.75), "eps": 0.0625,
               "alpha": 0.875, "lr_decay": 0.03125, "initial_accumulator_value": 1.5, "momentum_decay": 0.005,
               "weight_decay": 0.015625, "grad_norm_type": 1.0}
    script = ("import json, sys\n"
              "from graphc.compile import optim\n"
              "changed = json.loads(sys.argv[1])\n"
              "for spec in optim.BY_KIND.values():\n"
              "    for field, value in changed.items():\n"
              "        if field in spec.model_fields:\n"
              "            spec.model_fields[field].default = tuple(value) if isinstance(value, list) else value\n"
              "import typer\n"
              "from graphc.cli import app\n"
              "grad = typer.main.get_command(app).commands['grad']\n"
              "print(json.dumps({p.name: p.help for p in grad.params}))\n")
    result = subprocess.run([sys.executable, "-c", script, json.dumps(changed)], capture_output=True, text=True,
                            check=True)
    helps = json.loads(result.stdout)
    for field, value in changed.items():
        shown = ",".join(f"{v:g}" for v in value) if isinstance(value, tuple) else f"{value:g}"
        found = re.search(r"\(default: ([-+0-9.e]+(?:,[-+0-9.e]+)*)", helps[field])
        assert found and found.group(1) == shown, (field, helps[field])


def test_min_lr_help_gives_its_default_for_cosine_and_plateau_alike():
    """"cosine's final lr, plateau's floor (default 0)" read as plateau's default only; both are 0."""
    min_lr = next(p for p in COMMANDS["train"].params if p.name == "min_lr")
    assert "cosine's final lr and plateau's floor (default 0 for both)" in min_lr.help, min_lr.help
