"""torch names graphc has no counterpart for, each a function that refuses with the reason and the way out (a
ported script stops at the line, not at an ``AttributeError``): pickled files, a process-wide thread count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


_PICKLE = ("graphc never pickles; a module's weights are arrays by PyTorch's keys: "
           "safetensors.numpy.save_file(model.state_dict(), 'model.safetensors') and "
           "model.load_state_dict(safetensors.numpy.load_file('model.safetensors')); a captured model: "
           "model.save('model.onnx') and gc.load('model.onnx')")
_THREADS = ("graphc has no process-wide thread count; an onnxruntime session's threads are its option: "
            "gc.Session(model, backend='ort-cpu', threads=N), gc.Trainer(..., threads=N)")


def _refused(name: str, why: str, error: type[Exception]) -> Callable[..., Any]:
    def refused(*args: Any, **kwargs: Any) -> Any:
        raise error(f"gc.{name}: {why}")

    refused.__name__ = refused.__qualname__ = name
    refused.__doc__ = f"``torch.{name}``: refused: {why}."
    return refused


save = _refused("save", _PICKLE, NotImplementedError)
get_num_threads = _refused("get_num_threads", _THREADS, NotImplementedError)
set_num_threads = _refused("set_num_threads", _THREADS, NotImplementedError)

__all__ = ["get_num_threads", "save", "set_num_threads"]
