"""The PID namespace the agent runs in, and the C that gives every BPF program the ids of that namespace.

BPF's ``bpf_get_current_pid_tgid()`` answers in the initial PID namespace, whatever the agent's. An agent
started inside a host's own PID namespace (a container, or a host of docs/cluster-namespaces.md) finds its
targets in its own /proc, by the PIDs of its namespace: keyed by those, a BPF filter would match the
unrelated processes that carry the same numbers in the initial namespace and never the targets. There the
programs use ``bpf_get_ns_current_pid_tgid()`` (Linux 5.7+) with the namespace's nsfs device and inode
(from a map, so one compiled program serves every namespace):
the ids of a task of the agent's namespace as the agent sees them, and tgid 0 (never a target, the idle
task's) for every task of another namespace, so nothing of another host is counted. In the initial
namespace the plain helper stays: it is cheaper, and a task in a child namespace (a container the agent
samples from outside) still has its ids there.
"""

from __future__ import annotations

import ctypes as ct
import functools
import os
from dataclasses import dataclass
from typing import Any

SELF_PID_NS = "/proc/self/ns/pid"
INIT_PID_NS_INO = 0xEFFFFFFC  # PROC_PID_INIT_INO, include/linux/proc_ns.h: the initial namespace's inode


@dataclass(frozen=True)
class PidNamespace:
    """A PID namespace as the BPF helper names it: nsfs's device (the kernel's own dev_t encoding,
    major << 20 | minor, not stat's) and the namespace's inode."""

    dev: int
    ino: int

    @property
    def initial(self) -> bool:
        return self.ino == INIT_PID_NS_INO


def kernel_dev(st_dev: int) -> int:
    """stat's st_dev as the kernel's dev_t (what ``bpf_get_ns_current_pid_tgid`` compares with)."""
    return (os.major(st_dev) << 20) | os.minor(st_dev)


def pid_namespace_of(path: str) -> PidNamespace:
    info = os.stat(path)
    return PidNamespace(kernel_dev(info.st_dev), info.st_ino)


@functools.cache
def own_pid_namespace() -> PidNamespace | None:
    """This process's PID namespace; None when it cannot be read (taken as the initial one)."""
    try:
        return pid_namespace_of(SELF_PID_NS)
    except OSError:
        return None


OWN_PID_NS_MAP = "own_pid_ns"  # [0] nsfs device, [1] inode: written after load by write_own_namespace()


def ids_prelude(namespace: PidNamespace | None) -> str:
    """C defining ``current_pid_tgid()``: ``bpf_get_current_pid_tgid()`` as the agent's namespace sees it
    (tgid and pid 0 for a task of another namespace). The namespace itself is not in the text but in a map
    written after load, so the text, and its compile cache entry, is the same in every namespace."""
    if namespace is None or namespace.initial:
        return "#define current_pid_tgid() bpf_get_current_pid_tgid()\n"
    return (
        "// the agent runs in a PID namespace of its own (profiler/bpf/pidns.py): ids of that namespace,\n"
        "// 0 for tasks of other namespaces and until user space has written which namespace it is\n"
        f"BPF_ARRAY({OWN_PID_NS_MAP}, u64, 2);\n"
        "static __always_inline u64 current_pid_tgid(void) {\n"
        "    int dev_key = 0, ino_key = 1;\n"
        f"    u64 *dev = {OWN_PID_NS_MAP}.lookup(&dev_key), *ino = {OWN_PID_NS_MAP}.lookup(&ino_key);\n"
        "    if (dev == NULL || ino == NULL || *ino == 0)\n"
        "        return 0;\n"
        "    struct bpf_pidns_info ns = {};\n"
        "    if (bpf_get_ns_current_pid_tgid(*dev, *ino, &ns, sizeof(ns)) != 0)\n"
        "        return 0;\n"
        "    return ((u64)ns.tgid << 32) | ns.pid;\n"
        "}\n"
    )


def with_own_ids(text: str) -> str:
    """A program's C with ``current_pid_tgid()`` defined for the namespace this process runs in."""
    return ids_prelude(own_pid_namespace()) + text


def write_own_namespace(program: Any, namespace: PidNamespace | None = None) -> None:
    """Tell a loaded program (bcc's BPF or a cached one) which namespace is the agent's; nothing to do
    in the initial one."""
    namespace = namespace or own_pid_namespace()
    if namespace is None or namespace.initial:
        return
    table = program[OWN_PID_NS_MAP.encode()]
    table[ct.c_int(0)] = ct.c_uint64(namespace.dev)
    table[ct.c_int(1)] = ct.c_uint64(namespace.ino)
