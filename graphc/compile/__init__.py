"""The public fronts over ``graphc.passes``: ``optimize`` (``gc.optimize``), ``grad``
(``gc.grad``), ``training`` (``gc.training``: artifacts and their manifest), the ``losses`` and
``optim`` specs it takes, ``export`` (trained inference models) and ``opsets`` (conversion).

The package is callable: ``gc.compile(model, **options)`` is torch's ``compile``
(``graphc.dsl.torch_settings.compile``: the model as it is), as the sub-package and torch's
function share the name ``compile``."""

import sys
import types
from typing import Any


class _CallableModule(types.ModuleType):
    def __call__(self, model: Any = None, **options: Any) -> Any:
        from graphc.dsl.torch_settings import compile as torch_compile

        return torch_compile(model, **options)


sys.modules[__name__].__class__ = _CallableModule
