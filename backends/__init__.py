"""graphc.backends: the Backend protocol, the registry and the backends themselves.

The package is callable so that the public ``gc.backends()`` (a list of ``BackendInfo``) and
the sub-package ``graphc.backends`` can share one name, as the API contract requires.
"""

import sys
import types

from graphc.backends.base import Backend, BackendInfo, Executable
from graphc.backends.registry import BACKENDS, get_backend, list_backends


class _CallableModule(types.ModuleType):
    def __call__(self) -> list[BackendInfo]:
        return list_backends()


sys.modules[__name__].__class__ = _CallableModule

__all__ = ["BACKENDS", "Backend", "BackendInfo", "Executable", "get_backend", "list_backends"]
