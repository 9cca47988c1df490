"""The one error hierarchy of the host agent; only ``main`` catches it and prints one line."""

from __future__ import annotations


class ProfilerError(Exception):
    """An expected failure with a one-line message that says what to change."""

    exit_code = 1

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class ConfigError(ProfilerError):
    """Bad input file or option: the message names the file, the line and the fix."""

    exit_code = 2


class PrivilegeError(ProfilerError):
    """Missing root, CAP_BPF or CAP_PERFMON."""

    exit_code = 3


class CapabilityError(ProfilerError):
    """The kernel or machine cannot do what was asked (no bcc, no headers, no tracepoint...)."""

    exit_code = 4


class OutputExistsError(ProfilerError):
    """An output directory exists and ``--force`` was not given."""

    exit_code = 5


class OutputWriteError(ProfilerError):
    """The capture could not be written (disk full, read-only filesystem)."""

    exit_code = 10


class NothingToSampleError(ProfilerError):
    """Every process given by --pid was gone before a sample was taken and nothing else was found: the
    capture is written (its notes say when each went) but holds no samples."""

    exit_code = 7


class CaptureFormatError(ProfilerError):
    """A capture directory is missing files or has an unknown format version."""

    exit_code = 6


class VMStructsError(CapabilityError):
    """A JVM's vmStructs could not be read (not HotSpot, no libjvm.so symbols, memory unreadable): its
    interpreted frames stay unnamed; never fatal to a run (the sampler counts the cause)."""


def config_error(path: str, line: int | None, problem: str, fix: str) -> ConfigError:
    """Build the canonical one-line configuration error: ``file:line: problem; fix``."""
    where = f"{path}:{line}" if line is not None else path
    return ConfigError(f"{where}: {problem}; {fix}")
