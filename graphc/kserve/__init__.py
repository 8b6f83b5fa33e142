"""graphc's KServe v2 / Open Inference Protocol server: ``protocol`` (JSON and binary tensor
codec), ``repository`` (the models served, their sessions), ``app`` (the FastAPI routes).
``graphc.serving`` is the public entry (``gc.serve``)."""
