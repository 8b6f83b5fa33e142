"""The version of graphc and the producer name its captured models record (its own module, so code
below the public front can read them)."""

__version__ = "0.1.0"
PRODUCER = "graphc"
