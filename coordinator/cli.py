"""Entry point of the user's side: ``coordinator profile|fetch|analyze|summary|campaign|draft-profile|compare|
report|export|serve|doctor|demo``."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from profiler.cli import build_parser, dispatch

COMMAND_ORDER: tuple[str, ...] = (
    "profile", "fetch", "analyze", "summary", "campaign", "draft_profile", "compare", "report", "export", "serve",
    "doctor", "demo",
)
DESCRIPTION = "Profile every host of a stream-processing cluster and report CPU cycles per streaming task."


def main(argv: Sequence[str] | None = None) -> int:
    return dispatch(build_parser("coordinator", COMMAND_ORDER, DESCRIPTION), argv)


if __name__ == "__main__":
    sys.exit(main())
