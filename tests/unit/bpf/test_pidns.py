"""The ids BPF programs key their targets by: the agent's own PID namespace (profiler/bpf/pidns.py).
tests/integration/test_namespaced_hosts.py runs agents inside namespaces for real."""

from __future__ import annotations

import os
import re

from profiler.bpf import pidns
from profiler.bpf.pidns import INIT_PID_NS_INO, PidNamespace, ids_prelude, kernel_dev, write_own_namespace

CHILD = PidNamespace(dev=4, ino=4026532555)


def test_the_initial_namespace_keeps_the_plain_helper() -> None:
    for namespace in (None, PidNamespace(dev=4, ino=INIT_PID_NS_INO)):
        assert ids_prelude(namespace) == "#define current_pid_tgid() bpf_get_current_pid_tgid()\n"


def test_a_child_namespace_asks_the_kernel_for_the_namespace_user_space_wrote() -> None:
    text = ids_prelude(CHILD)
    assert "BPF_ARRAY(own_pid_ns, u64, 2);" in text
    assert re.search(r"if \(dev == NULL \|\| ino == NULL \|\| \*ino == 0\)\n\s+return 0;", text)  # not yet written
    call = re.search(r"bpf_get_ns_current_pid_tgid\(\*dev, \*ino, &ns, sizeof\(ns\)\) != 0\)\n\s+return 0;", text)
    assert call is not None, text
    assert "return ((u64)ns.tgid << 32) | ns.pid;" in text  # the layout of bpf_get_current_pid_tgid
    assert "bpf_get_current_pid_tgid" not in text  # never the initial namespace's ids
    # the same text for every namespace: one compile cache entry serves them all
    assert ids_prelude(PidNamespace(dev=5, ino=4026532999)) == text


def test_the_namespace_is_written_into_the_loaded_program() -> None:
    tables: dict[bytes, dict[int, int]] = {}

    class Program:
        def __getitem__(self, name: bytes) -> dict:
            return tables.setdefault(name, _Table())

    class _Table(dict):
        def __setitem__(self, key, value) -> None:
            super().__setitem__(key.value, value.value)

    write_own_namespace(Program(), CHILD)
    assert tables == {b"own_pid_ns": {0: 4, 1: 4026532555}}
    tables.clear()
    write_own_namespace(Program(), PidNamespace(dev=4, ino=INIT_PID_NS_INO))
    assert tables == {}  # the initial namespace has no map


def test_the_device_is_the_kernels_encoding_not_stats() -> None:
    # major 0 minor 4 (nsfs as usual) is the same in both; a large minor and a major differ
    assert kernel_dev(os.makedev(0, 4)) == 4
    assert kernel_dev(os.makedev(0, 300)) == 300
    assert kernel_dev(os.makedev(8, 1)) == (8 << 20) | 1


def test_own_namespace_is_read_from_proc_self(monkeypatch, tmp_path) -> None:
    here = pidns.pid_namespace_of("/proc/self/ns/pid")
    assert here.ino == os.stat("/proc/self/ns/pid").st_ino
    monkeypatch.setattr(pidns, "SELF_PID_NS", str(tmp_path / "missing"))
    pidns.own_pid_namespace.cache_clear()
    try:
        assert pidns.own_pid_namespace() is None  # unreadable: the plain helper
        assert pidns.with_own_ids("int x;") == ids_prelude(None) + "int x;"
    finally:
        pidns.own_pid_namespace.cache_clear()


def test_every_program_uses_the_namespace_aware_ids() -> None:
    """No BPF source of the agent calls the initial namespace's helper itself."""
    from pathlib import Path

    root = Path(pidns.__file__).resolve().parents[1]
    sources = [*root.rglob("*.c"), *root.rglob("*.h")]
    assert sources
    offenders = [str(p) for p in sources if re.search(r"bpf_get_current_pid_tgid\s*\(", p.read_text())]
    assert offenders == []
