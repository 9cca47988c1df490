"""One module per ``profiler`` subcommand; each exposes ``COMMAND``, a class with prepare_parser/run.

The top of the host agent: a command may import any room, and nothing imports a command but cli.py,
which finds them by name (contract `profiler-layers` in pyproject.toml).
"""
