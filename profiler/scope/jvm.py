"""Facts about a running JVM, learnt without attaching to it (its executable, JDK release file and flags).

Nothing here runs a program: attach requests (Thread.print, Compiler.perfmap, agent loading) go through
profiler.scope.attach, never through a JDK's ``jcmd`` (the target's own file, docs/security.md).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from ..files import procread, safeio

_PFP_ON = "-XX:+PreserveFramePointer"
_PFP_OFF = "-XX:-PreserveFramePointer"
_FLAG_VARIABLES = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")  # in this order before the line


@dataclass(frozen=True)
class JvmInfo:
    pid: int
    java_home: str | None
    version: str | None  # e.g. "17.0.15"; None when it could not be read
    preserve_frame_pointer: bool

    @property
    def major(self) -> int | None:
        if not self.version:
            return None
        head = self.version.split(".")[0]
        if head == "1" and "." in self.version:  # "1.8.0_392"
            head = self.version.split(".")[1]
        return int(head) if head.isdigit() else None

    @property
    def has_perfmap_command(self) -> bool:
        """``jcmd PID Compiler.perfmap`` exists from JDK 17 on."""
        return (self.major or 0) >= 17


def _cmdline(pid: int) -> list[str]:
    line = procread.cmdline(pid)  # bounded: CMDLINE_MAX_BYTES, a warning past it
    return [] if line is None else [arg for arg in line.args if arg]


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def is_jvm(pid: int) -> bool:
    exe = _exe(pid)
    if exe is not None and (exe.endswith("/java") or exe.endswith("/java (deleted)")):
        return True
    args = _cmdline(pid)
    return bool(args) and os.path.basename(args[0]) == "java"


def preserve_frame_pointer_from_args(args: list[str]) -> bool:
    """The last PreserveFramePointer flag wins, as in HotSpot; off by default."""
    state = False
    for arg in args:
        if arg == _PFP_ON:
            state = True
        elif arg == _PFP_OFF:
            state = False
    return state


def _java_home(pid: int) -> str | None:
    exe = _exe(pid)
    if exe is None:
        return None
    exe = exe.removesuffix(" (deleted)")
    # <home>/bin/java, or <home>/jre/bin/java on JDK 8
    home = Path(exe).parent.parent
    if home.name == "jre" and Path(f"/proc/{pid}/root{home.parent}/release").exists():
        home = home.parent
    # The JVM may live in another mount namespace: read through /proc/PID/root.
    return str(home)


def _read_release_version(pid: int, home: str) -> str | None:
    """JAVA_VERSION of the JDK's release file, read under the JVM's root (safeio: no link, no FIFO,
    64 KB at most, owned by root or the JVM's user)."""
    try:
        text = safeio.read_in_root(pid, f"{home}/release", 64 << 10, (0, safeio.owner(pid)[0])).decode(
            "utf-8", "replace"
        )
    except OSError:
        return None
    match = re.search(r'^JAVA_VERSION="([^"]+)"', text, re.MULTILINE)
    return match.group(1) if match else None


def jvm_info(pid: int) -> JvmInfo | None:
    """What we can learn about a JVM without attaching to it; None when ``pid`` is not a JVM."""
    if not is_jvm(pid):
        return None
    home = _java_home(pid)
    version = _read_release_version(pid, home) if home else None
    # JAVA_TOOL_OPTIONS and JDK_JAVA_OPTIONS also carry flags; they come before the command line.
    environ = procread.environ(pid, _FLAG_VARIABLES)  # bounded: ENVIRON_MAX_BYTES, a warning past it
    env_flags = [flag for name in _FLAG_VARIABLES for flag in environ.get(name, "").split()]
    return JvmInfo(pid, home, version, preserve_frame_pointer_from_args(env_flags + _cmdline(pid)))
