"""The user's side: cluster file, SSH transport, commands, PySpark pipeline and reports."""

from profiler import __version__

__all__ = ["__version__"]
