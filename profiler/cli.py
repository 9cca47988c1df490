"""Entry point of the host agent: ``profiler run|doctor|match``."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Sequence

from . import __version__
from .errors import ProfilerError

# Preferred order in --help; any other module in the commands package is listed after these.
# Command modules import heavy dependencies (bcc, pyspark) inside run(), never at import time.
COMMAND_ORDER: tuple[str, ...] = ("run", "recover", "doctor", "match")
DESCRIPTION = "Task-level CPU profiler host agent: samples stream-engine processes with eBPF."


def discover_commands(package: str, order: Sequence[str]) -> list[str]:
    """Module names under ``<package>.commands``: one subcommand each (``foo_bar`` is ``foo-bar``)."""
    commands_pkg = importlib.import_module(f"{package}.commands")
    found = {info.name for info in pkgutil.iter_modules(commands_pkg.__path__) if not info.name.startswith("_")}
    return [name for name in order if name in found] + sorted(found - set(order))


def build_parser(package: str, order: Sequence[str], description: str) -> argparse.ArgumentParser:
    """Shared by both CLIs, each named after its package: one subparser per command class, its docstring
    as help."""
    parser = argparse.ArgumentParser(prog=package, description=description)
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module_name in discover_commands(package, order):
        name = module_name.replace("_", "-")
        module = importlib.import_module(f"{package}.commands.{module_name}")
        cls = module.COMMAND
        doc = (cls.__doc__ or "").strip()
        summary = doc.splitlines()[0] if doc else name
        command_parser = sub.add_parser(
            name, help=summary, description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
        )
        command = cls()
        command.prepare_parser(command_parser)
        command_parser.set_defaults(_command=command)
    return parser


def dispatch(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> int:
    args = parser.parse_args(argv)
    command = getattr(args, "_command", None)
    if command is None:
        parser.print_help()
        return 2
    try:
        return int(command.run(args))
    except ProfilerError as exc:
        print(f"{parser.prog} {args.command}: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"{parser.prog} {args.command}: interrupted", file=sys.stderr)
        return 130


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(build_parser("profiler", COMMAND_ORDER, DESCRIPTION), argv)


if __name__ == "__main__":
    sys.exit(main())
