"""The module paths from before graphc/ was grouped into folders still import, as the very
modules at the new paths (graphc/__init__.py's _MOVED)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import graphc
from graphc import _MOVED

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old", sorted(_MOVED))
def test_old_path_is_the_module_at_its_new_path(old: str):
    module = importlib.import_module(old)
    assert module is importlib.import_module(_MOVED[old])
    assert module.__name__ == module.__spec__.name == _MOVED[old]


def test_a_module_under_an_old_package_path_is_not_loaded_twice():
    from graphc.kserve.model_config import ModelConfig
    from graphc.serving.kserve import model_config

    assert ModelConfig is model_config.ModelConfig
    assert sys.modules["graphc.kserve.model_config"] is model_config


def test_old_paths_work_in_a_fresh_interpreter():
    code = ("from graphc.trainer import Trainer, TrainingFailed; import graphc.training, graphc as gc; "
            "assert Trainer is gc.Trainer and gc.training is graphc.training; "
            "from graphc.checkpoint import CheckpointError; assert CheckpointError.__module__ == 'graphc.runtime.checkpoint'")
    subprocess.run([sys.executable, "-c", code], check=True)


def _old_path(module: str) -> bool:
    return any(module == old or module.startswith(old + ".") for old in _MOVED)


def test_the_repository_imports_new_paths_only():
    """The old paths are for users; graphc's own code and tests name where modules live."""
    found = []
    for folder in ("graphc", "passes", "backends", "models", "scripts", "tests"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.name == "test_layout.py":
                continue
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    names = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
                else:
                    continue
                found += [f"{path.relative_to(ROOT)}:{node.lineno}: {name}" for name in names if _old_path(name)]
    assert found == []


def test_unknown_paths_still_fail():
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("graphc.no_such_module")
    assert graphc.__name__ == "graphc"
