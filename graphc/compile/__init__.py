"""The public fronts over ``graphc.passes``: ``optimize`` (``gc.optimize``), ``grad``
(``gc.grad``), ``training`` (``gc.training``: artifacts and their manifest), the ``losses`` and
``optim`` specs it takes, ``export`` (trained inference models) and ``opsets`` (conversion)."""
