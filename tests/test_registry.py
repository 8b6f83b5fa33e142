"""The backend registry: names, availability with reasons, "auto", no silent fallback."""

from __future__ import annotations

import pytest

import graphc as gc
from graphc.backends import registry


def test_backends_lists_every_registered_backend_with_a_reason_when_unavailable():
    infos = gc.backends()
    assert [i.name for i in infos] == ["ort-cuda", "ort-cpu", "numpy"]
    assert all(isinstance(i, gc.BackendInfo) for i in infos)
    for info in infos:
        assert info.available or info.reason, f"{info.name} is unavailable without a reason"
    cpu = next(i for i in infos if i.name == "ort-cpu")
    assert cpu.available and cpu.device == "cpu" and cpu.reason == ""


def test_a_backend_that_fails_to_import_is_unavailable_with_the_reason(monkeypatch):
    monkeypatch.setitem(registry.BACKENDS, "broken", "graphc.backends.no_such_module:Backend")
    info = next(i for i in gc.backends() if i.name == "broken")
    assert not info.available and "cannot load graphc.backends.no_such_module" in info.reason
    with pytest.raises(gc.BackendUnavailable, match="backend 'broken' is not available here: cannot load"):
        registry.get_backend("broken")


def test_auto_skips_unavailable_backends_in_preference_order(monkeypatch):
    monkeypatch.setattr(registry, "BACKENDS", {"broken": "graphc.backends.no_such_module:Backend",
                                               "ort-cpu": registry.BACKENDS["ort-cpu"]})
    assert registry.get_backend("auto").name == "ort-cpu"


def test_auto_with_nothing_available_says_why_for_each(monkeypatch):
    monkeypatch.setattr(registry, "BACKENDS", {"broken": "graphc.backends.no_such_module:Backend"})
    with pytest.raises(gc.BackendUnavailable, match=r"no backend is available \(broken: cannot load"):
        registry.get_backend("auto")


def test_unknown_name_lists_the_choices():
    with pytest.raises(gc.BackendUnavailable, match="unknown backend 'gpu'; choose one of auto, ort-cuda, ort-cpu, numpy"):
        registry.get_backend("gpu")
