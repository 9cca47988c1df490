"""One module per ``profiler`` subcommand; each exposes ``COMMAND``, a class with prepare_parser/run."""
