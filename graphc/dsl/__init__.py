"""The DSL, in layers that import only downward (``tests/test_import_graph.py`` checks it):

1. builder: ``builder`` (the capture ``Builder``: scopes, naming, node emission, inference,
   source lines), ``eager`` (evaluating a node on example values);
2. tensor: ``tensor`` (``gc.Tensor``);
3. functions: ``ops``, ``ops_nn``, ``ops_array`` (torch's array functions), ``ops_layers`` (the
   functional forms of the newer layers), ``indexing``, ``control``, ``losses``;
4. ``graphc.nn``: modules and layers;
5. ``capture``: ``gc.capture``.

The public names are on ``graphc`` (``gc.relu``, ``gc.capture``, ``gc.Tensor``) and ``graphc.nn``.
"""
