"""The version of graphc (its own module, so code below the public front can read it)."""

__version__ = "0.1.0"
