"""The ``hbmwatch`` command: the top floor, above the composition root (``runtime``)."""

from hbmwatch.cli.main import app, main

__all__ = ["app", "main"]
