"""graphc's KServe v2 / Open Inference Protocol server: ``protocol`` (JSON and binary tensor
codec), ``repository`` (the models served, their sessions), ``infer`` (the infer endpoint, a
plain ASGI fast path), ``app`` (the FastAPI app with the other routes), ``extensions`` (the
Triton extensions it implements, and the parameters and routes of those it refuses).
``graphc.serving.serve`` is the public entry (``gc.serve``)."""
