"""torch names graphc has no counterpart for, each a function that refuses with the reason and the way out (a
ported script stops at the line, not at an ``AttributeError``): complex tensors (ONNX has no complex arithmetic),
pickled files, a process-wide thread count."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from graphc.errors import CaptureError

_COMPLEX = ("ONNX has no complex arithmetic, so graphc has no complex dtype; keep the real and imaginary parts as "
            "two real Tensors (rotary embeddings: x * cos + rotate_half(x) * sin, with gc.cos/gc.sin of the angles)")
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


view_as_real = _refused("view_as_real", _COMPLEX, CaptureError)
view_as_complex = _refused("view_as_complex", _COMPLEX, CaptureError)
view_as_real_copy = _refused("view_as_real_copy", _COMPLEX, CaptureError)
view_as_complex_copy = _refused("view_as_complex_copy", _COMPLEX, CaptureError)
polar = _refused("polar", _COMPLEX, CaptureError)
complex = _refused("complex", _COMPLEX, CaptureError)  # noqa: A001 - torch's name
save = _refused("save", _PICKLE, NotImplementedError)
get_num_threads = _refused("get_num_threads", _THREADS, NotImplementedError)
set_num_threads = _refused("set_num_threads", _THREADS, NotImplementedError)

__all__ = ["complex", "get_num_threads", "polar", "save", "set_num_threads", "view_as_complex",
           "view_as_complex_copy", "view_as_real", "view_as_real_copy"]
