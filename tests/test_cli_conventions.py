"""What every `graphc` command does alike, as a new user and a script meet it: `--version` and
`-h`, a summary line per command that fits `graphc --help`, `--json` on the commands that report
(backends, inspect, parity), `~` in a path expanded where the shell left it (`--output=~/m.onnx`),
`-` refused as an output file (it made a file named `-`), and a reader that closes the pipe early
(`graphc parity m.onnx | head -1`)."""

import json
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import typer

import graphc as gc
from graphc.cli import app
from graphc.version import __version__

from cli_util import NET_PY, one_line_error, run_cli, workspace

RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def ws(tmp_path_factory):
    root = workspace(tmp_path_factory.mktemp("cli_conventions"))
    (root / "net.py").write_text(NET_PY)
    np.save(root / "x.npy", RNG.standard_normal((3, 8)).astype(np.float32))
    return root


def test_version_prints_graphcs_version(capsys):
    result = run_cli(capsys, "--version")
    assert (result.code, result.out, result.err) == (0, f"graphc {__version__}\n", "")


@pytest.mark.parametrize("words", [[], ["run"], ["deploy", "triton"]])
def test_h_is_help(capsys, words):
    long, short = run_cli(capsys, *words, "--help"), run_cli(capsys, *words, "-h")
    assert short.code == long.code == 0 and short.out == long.out and "-h, --help" in long.out


def test_every_command_summary_fits_the_command_list(capsys):
    """click cuts a summary too long for `graphc --help`'s 80 columns with `...`
    (serve's and deploy triton's were)."""
    for group in ([], ["deploy"]):
        listing = run_cli(capsys, *group, "--help").out.split("Commands:")[1]
        assert "..." not in listing, listing


def test_serve_help_gives_every_limits_default(capsys):
    command = typer.main.get_command(app).commands["serve"]
    limits = [p for p in command.params if p.name.startswith("max_") or p.name.endswith("_timeout")]
    assert len(limits) == 9 and all("default" in p.help for p in limits), [p.help for p in limits]


def test_backends_json_is_gc_backends(capsys):
    result = run_cli(capsys, "backends", "--json")
    assert result.code == 0 and json.loads(result.out) == [b.model_dump() for b in gc.backends()]


def test_inspect_json_describes_the_model(ws, capsys):
    result = run_cli(capsys, "inspect", ws / "mlp.onnx", "--json", "--dim", "batch=5")
    assert result.code == 0, result.err
    said = json.loads(result.out)
    model = gc.load(ws / "mlp.onnx")
    assert said["inputs"] == [{"name": s.name, "dtype": s.dtype, "shape": list(s.shape), "complex": None}
                               for s in model.inputs]
    assert said["nodes"] == len(onnx.load(ws / "mlp.onnx").graph.node) == sum(said["ops"].values())
    # the batch of 5 rows through Gemm [8 -> 16] and MatMul [16 -> 3]: 2*5*(8*16 + 16*3) multiply-adds
    assert said["flops"]["dims"] == {"batch": 5} and said["flops"]["total"] == 2 * 5 * (8 * 16 + 16 * 3)
    # the initializers: Gemm's weight and bias, the Add's bias (the MatMul's weight is a Constant node)
    assert said["parameters"] == {"elements": 8 * 16 + 16 + 3, "bytes": 4 * (8 * 16 + 16 + 3), "initializers": 3}


@pytest.mark.parametrize("bisect", [[], ["--bisect"]])
def test_parity_json_is_the_report(ws, capsys, bisect):
    result = run_cli(capsys, "parity", ws / "mlp.onnx", "--json", "--dim", "batch=3", *bisect)
    assert result.code == 0, result.err
    said = json.loads(result.out)
    assert said["ok"] is True and said["backends"] == ["numpy", "ort-cpu"] and said["bisected"] == bool(bisect)
    assert [(d["name"], d["backend"], d["shape"]) for d in said["details"]] == [("logits", "ort-cpu", [3, 3])]


def test_parity_json_exits_1_on_a_mismatch(ws, capsys, monkeypatch):
    from graphc.runtime import parity

    real = parity.compare  # the report of a backend that got an inf
    monkeypatch.setattr(parity, "compare", lambda *a, **k: _mismatched(real(*a, **k)))
    result = run_cli(capsys, "parity", ws / "mlp.onnx", "--json")
    said = json.loads(result.out)
    assert result.code == 1 and said["ok"] is False and said["details"][0]["max_abs_err"] == "inf"


def _mismatched(report):
    detail = report.details[0].model_copy(update={"ok": False, "max_abs_err": float("inf")})
    return report.model_copy(update={"details": [detail]})


def test_json_writes_non_finite_numbers_as_strings(capsys):
    from graphc.cli.app import print_json

    print_json({"err": [float("inf"), float("-inf"), float("nan"), 1.5]})
    assert json.loads(capsys.readouterr().out) == {"err": ["inf", "-inf", "nan", 1.5]}


@pytest.fixture
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "home").mkdir()
    return tmp_path / "home"


def test_a_tilde_the_shell_left_is_expanded(ws, capsys, home):
    """`--output=~/m.onnx` reaches graphc as typed: it made a folder named ~ in the current one."""
    result = run_cli(capsys, "capture", f"{ws}/net.py:Net", "-i", "x:float32[N,4]", "--output=~/m.onnx")
    assert result.code == 0, result.err
    np.save(home / "x.npy", np.ones((2, 4), np.float32))
    result = run_cli(capsys, "run", "~/m.onnx", "--input=x=~/x.npy", "-o", "~/out.npz")
    assert result.code == 0, result.err
    assert sorted(p.name for p in home.iterdir()) == ["m.onnx", "out.npz", "x.npy"]
    assert not (home.parent / "~").exists()
    assert np.load(home / "out.npz")["output"].shape == (2, 2)


@pytest.mark.parametrize("args, option", [
    (["capture", "{ws}/net.py:Net", "-i", "x:float32[N,4]", "-o", "-"], "-o/--output"),
    (["optimize", "{ws}/mlp.onnx", "-o", "-"], "-o/--output"),
    (["run", "{ws}/mlp.onnx", "-i", "x={ws}/x.npy", "-o", "-"], "-o/--output"),
    (["export", "{ws}/arts", "-o", "-", "--allow-untrained"], "-o/--output"),
    (["view", "{ws}/mlp.onnx", "-o", "-"], "-o/--output"),
    (["train", "{ws}/arts", "--data", "{ws}/data.npz", "--epochs", "1", "--batch-size", "8", "--log", "-"], "--log"),
])
def test_dash_as_an_output_is_refused(ws, capsys, home, args, option):
    """`-` is standard output to other tools; graphc wrote a file named `-`."""
    err = one_line_error(run_cli(capsys, *(a.format(ws=ws) for a in args)))
    assert f"{option} -: graphc writes a file here, not standard output" in err
    assert not (home.parent / "-").exists()


GRAPHC = [sys.executable, "-c", "import sys; from graphc.cli import main; sys.exit(main())"]


@pytest.mark.parametrize("args", [["inspect", "mlp.onnx"], ["parity", "mlp.onnx"],
                                  ["train", "arts", "--data", "data.npz", "--epochs", "2", "--batch-size", "16"],
                                  ["--help"], ["-h"], ["--version"], ["train", "--help"], ["deploy", "--help"],
                                  ["deploy", "triton", "--help"]], ids=" ".join)
def test_a_closed_stdout_exits_141_silently(ws, args):
    # rich's and typer's own handling exited 1, which says a check failed (parity: a mismatch), and
    # so did help and --version, printed by click while it parses; the read end is closed before
    # the command starts, so every print meets the closed pipe
    read, write = os.pipe()
    os.close(read)
    done = subprocess.run([*GRAPHC, *args], stdout=write, stderr=subprocess.PIPE, text=True, cwd=ws, timeout=120,
                          check=False)
    os.close(write)
    assert (done.returncode, done.stderr) == (141, "")


@pytest.mark.parametrize("args", [["--help"], ["train", "--help"]], ids=" ".join)
def test_help_read_to_its_first_line(args):
    # `graphc --help | head -1`: the help fits the pipe's buffer, so whether its write meets the
    # closed pipe depends on who runs first: 0 or 141, never a failed check's 1, and nothing said
    with subprocess.Popen([*GRAPHC, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
    assert first.startswith(f"Usage: graphc {' '.join(args[:-1])}".rstrip() + " [OPTIONS]")
    assert (proc.returncode in (0, 141), err) == (True, "")
