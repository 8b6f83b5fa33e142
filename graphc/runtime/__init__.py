"""Running graphs: ``session`` (``gc.Session``) and its ``feeds`` checks, ``parity`` across
backends, and training: ``trainer`` (``gc.Trainer``), ``data``, ``checkpoint``, ``metrics``,
``history``, ``progress``, ``interrupts``, ``tensorboard``, ``distributed`` (Ray)."""
