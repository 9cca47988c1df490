"""One module per ``coordinator`` subcommand; each exposes ``COMMAND``, a class with prepare_parser/run."""
