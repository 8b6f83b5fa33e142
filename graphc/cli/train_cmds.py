"""graphc CLI commands (filled in by its owner)."""

from graphc.cli.app import app  # noqa: F401
