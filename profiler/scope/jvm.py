"""Facts about a running JVM and running ``jcmd`` against it as the JVM's own user.

HotSpot's attach mechanism only answers a caller with the JVM's uid and gid, in the JVM's mount
namespace (the attach socket lives in the JVM's /tmp), so root must switch to both.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
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


def _same_mount_ns(pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt") == os.readlink("/proc/self/ns/mnt")
    except OSError:
        return True


def jcmd_path(pid: int) -> str | None:
    """The target JVM's own jcmd (matching version), else the first one on PATH."""
    home = _java_home(pid)
    if home:
        candidate = Path(f"/proc/{pid}/root{home}/bin/jcmd")
        if candidate.exists():
            # a path inside the JVM's mount namespace; run_jcmd enters that namespace when it differs
            return str(Path(home) / "bin" / "jcmd")
    return shutil.which("jcmd")


def _roots_own(path: str) -> bool:
    """Whether ``path`` and every directory above it (links resolved) are root's and writable by root
    only: a binary nobody else could have placed or changed, safe to run with root's rights."""
    current = Path(os.path.realpath(path))
    for part in (current, *current.parents):
        try:
            info = os.lstat(part)
        except OSError:
            return False
        if info.st_uid != 0 or info.st_mode & 0o022:
            return False
    return True


class RootJvmError(PermissionError):
    """A JVM running as root whose jcmd is not root's own file on this host (a container's): never run
    (the attach socket accepts root anyway)."""


def run_jcmd(pid: int, *command: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    """Run ``jcmd <pid> <command...>`` as the JVM's user with no capabilities, inside its mount
    namespace when it differs. The jcmd may be the target's own (a tenant's file): it runs as root only
    when the JVM is root's and the jcmd root's own file on this host; a root JVM in a container is
    refused with RootJvmError (its jcmd is the container's)."""
    uid, gid = safeio.owner(pid)
    jcmd = jcmd_path(pid)
    if jcmd is None:
        raise FileNotFoundError("jcmd not found: install a JDK (openjdk-17-jdk-headless) on this host")
    if uid == 0 and not (_same_mount_ns(pid) and _roots_own(jcmd)):
        raise RootJvmError(
            f"pid {pid} runs as root and {jcmd} is not root's own file on this host: not run with root's rights "
            "(the attach socket only)"
        )
    argv: list[str] = [jcmd, str(pid), *command]
    environment = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
    if not _same_mount_ns(pid) and shutil.which("nsenter"):
        # Inside the container the JVM's pid may differ; jcmd there must see its own pid namespace too.
        # nsenter (root's binary) enters the namespaces, then becomes the JVM's user before running jcmd;
        # no_new_privs (set before nsenter) stays on through both.
        ns_pid = _namespace_pid(pid)
        argv = ["nsenter", "-t", str(pid), "-m", "-p", "-S", str(uid), "-G", str(gid), jcmd, str(ns_pid), *command]
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=timeout, env=environment, preexec_fn=safeio.no_new_privs
        )
    return subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, env=environment, preexec_fn=safeio.demote_to(uid, gid)
    )


def _namespace_pid(pid: int) -> int:
    """The pid as seen inside the process's own pid namespace (last NSpid entry)."""
    nspids = (procread.status_field(pid, "NSpid") or "").split()
    return int(nspids[-1]) if nspids and nspids[-1].isascii() and nspids[-1].isdigit() else pid
