"""Coordinator errors extend the host agent's hierarchy, so one ``main`` handler serves both."""

from __future__ import annotations

from profiler.errors import ConfigError, ProfilerError

__all__ = ["ConfigError", "ProfilerError", "HostUnreachable", "HostKeyError", "PartialRunError"]


class HostUnreachable(ProfilerError):
    """A host of cluster.txt could not be reached or authenticated."""

    exit_code = 7


class HostKeyError(ProfilerError):
    """A host key is unknown (and --accept-new-hosts was not given) or has changed."""

    exit_code = 8


class PartialRunError(ProfilerError):
    """Some hosts were not profiled; the run directory holds the others."""

    exit_code = 9
