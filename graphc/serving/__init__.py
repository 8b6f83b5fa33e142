"""Deployment and serving: ``deploy`` (``gc.deploy``: Triton repositories), ``serve``
(``gc.serve``) and ``kserve``, the KServe v2 / Open Inference Protocol server it runs."""
