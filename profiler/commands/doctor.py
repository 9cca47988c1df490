"""`profiler doctor`: can this host be profiled? One row per check, with the fix for each problem."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import re
import shutil
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from ..errors import VMStructsError
from ..unwind.cpython import supported_versions
from ..unwind.vmstructs import ProcessMemory, read_layout

OK, WARN, FAIL = "ok", "warn", "fail"

CAP_SYS_ADMIN = 21
CAP_PERFMON = 38
CAP_BPF = 39
TRACEPOINTS = ("sched_process_exec", "sock_send_length", "sock_recv_length")
SAMPLING_CLOCK = "cpu-clock"
PFP_FIX = (
    "start the JVMs with -XX:+PreserveFramePointer "
    "(Spark: spark.executor.extraJavaOptions=-XX:+PreserveFramePointer and spark.driver.extraJavaOptions; "
    "Flink: env.java.opts.all: -XX:+PreserveFramePointer)"
)


@dataclass(frozen=True)
class Check:
    """One row of the doctor's table (and one object of its JSON list)."""

    check: str
    status: str  # ok, warn, fail
    detail: str
    fix: str = ""


# ---------------------------------------------------------------- pure checks (unit-tested)


def privilege_check(euid: int, cap_eff: int) -> Check:
    def has(cap: int) -> bool:
        return bool(cap_eff >> cap & 1)

    if euid == 0 and has(CAP_SYS_ADMIN):
        return Check("privileges", OK, "root")
    if has(CAP_SYS_ADMIN) or (has(CAP_BPF) and has(CAP_PERFMON)):
        return Check("privileges", OK, f"uid {euid} with CAP_BPF+CAP_PERFMON (or CAP_SYS_ADMIN)")
    missing = [name for cap, name in ((CAP_BPF, "CAP_BPF"), (CAP_PERFMON, "CAP_PERFMON")) if not has(cap)]
    return Check(
        "privileges",
        FAIL,
        f"uid {euid} lacks {' and '.join(missing)}: BPF programs and perf events cannot be opened",
        "run as root (sudo profiler ...) or grant the capabilities: setcap cap_bpf,cap_perfmon,cap_sys_ptrace+ep",
    )


def headers_check(release: str, build: Path, kheaders: Path) -> Check:
    """Kernel headers for bcc: /lib/modules/<release>/build, and whether they belong to this kernel."""
    if build.exists() and (build / "include").exists():
        target = build.resolve()
        found = re.search(r"linux-headers-(.+?)(?:-common)?$", target.name)
        version = found.group(1) if found else target.name
        if version != release and not release.startswith(version):
            return Check(
                "kernel-headers",
                WARN,
                f"{build} -> {target}: headers of kernel {version}, running {release}",
                "headers from another kernel version: fine while BTF covers the structures the programs read;"
                f" install linux-headers-{release} when it exists",
            )
        return Check("kernel-headers", OK, f"{build} -> {target}")
    if kheaders.exists():
        return Check("kernel-headers", OK, f"{kheaders} (CONFIG_IKHEADERS)")
    return Check(
        "kernel-headers",
        FAIL,
        f"no {build} and no {kheaders}: bcc cannot compile",
        "install linux-headers-$(uname -r) (or linux-headers-amd64 and link it: make setup)",
    )


def max_stack_check(value: int | None) -> Check:
    if value is None:
        return Check("perf_event_max_stack", WARN, "kernel.perf_event_max_stack unreadable", "check /proc/sys/kernel")
    if value < 127:
        return Check(
            "perf_event_max_stack",
            WARN,
            f"{value}: stacks deeper than this are truncated",
            "profiler run --max-stack-depth 1024 raises it for the run"
            " (or: sysctl -w kernel.perf_event_max_stack=1024)",
        )
    if value < 512:
        # Our walker (--stack-walk bpf, the default) walks user stacks itself: only kernel stacks (<= 127
        # frames) and the bpf_get_stack fallback depend on this sysctl.
        return Check(
            "perf_event_max_stack",
            OK,
            f"{value}: enough for our stack walker; with --stack-walk kernel, Java stacks deeper than this are "
            "truncated (profiler run --max-stack-depth 1024 --stack-walk kernel raises it for the run)",
        )
    return Check("perf_event_max_stack", OK, str(value))


def paranoid_check(value: int | None, privileged: bool) -> Check:
    if value is None:
        return Check("perf_event_paranoid", WARN, "kernel.perf_event_paranoid unreadable", "check /proc/sys/kernel")
    if privileged or value <= 1:
        return Check(
            "perf_event_paranoid", OK, f"{value}" + (" (no effect with root/CAP_PERFMON)" if privileged else "")
        )
    return Check(
        "perf_event_paranoid",
        FAIL,
        f"{value}: unprivileged users cannot count or sample other processes",
        "run as root, or sysctl -w kernel.perf_event_paranoid=1",
    )


def pmu_check(probe: Mapping[str, str]) -> Check:
    working = [name for name, state in probe.items() if state == "ok"]
    missing = {name: state for name, state in probe.items() if state != "ok"}
    detail = f"counting: {', '.join(working) or 'nothing'}"
    by_reason: dict[str, list[str]] = {}
    for name, state in missing.items():
        # "ENOENT: no hardware PMU event cycles on this CPU/VM" -> one group per errno
        by_reason.setdefault(state.split(":", 1)[0], []).append(name)
    for reason, names in by_reason.items():
        detail += f"; unsupported ({reason}): {', '.join(names)}"
    if any(probe.get(name, "").startswith("ENOENT") for name in ("cycles", "instructions")):
        detail += " (no hardware PMU on this CPU/VM)"
    if probe.get("task-clock") != "ok":
        return Check(
            "pmu-events",
            FAIL,
            detail,
            "task-clock must work for CPU time and the cycle estimate: check privileges and perf_event_paranoid",
        )
    if probe.get("cycles") != "ok":
        return Check(
            "pmu-events",
            WARN,
            detail + "; cycles will be estimated as task-clock x nominal frequency (cycles_estimated=1)",
            "for measured cycles run on bare metal or enable the virtual PMU (e.g. KVM -cpu host, a VM type with vPMU)",
        )
    if missing:
        return Check("pmu-events", WARN, detail, "unsupported events are recorded as unsupported (empty), never 0")
    return Check("pmu-events", OK, detail)


def _listed(jvms: Sequence[tuple[int, str]], most: int = 30) -> str:
    """``pid (what), …`` of the first ``most`` JVMs, and how many more."""
    listed = ", ".join(f"{pid} ({what})" for pid, what in jvms[:most])
    return listed + (f" and {len(jvms) - most} more" if len(jvms) > most else "")


def frame_pointer_check(jvms: Sequence[tuple[int, str, bool]], walkable: Collection[int] = ()) -> Check:
    """jvms: (pid, short description, PreserveFramePointer on); walkable: pids whose JIT frames the
    HotSpot unwinder walks without frame pointers (their code cache read from vmStructs)."""
    if not jvms:
        return Check("jvm-frame-pointers", OK, "no JVM running")
    without = [(pid, what) for pid, what, on in jvms if not on and pid not in walkable]
    unwound = [pid for pid, _what, on in jvms if not on and pid in walkable]
    by_unwinder = f"; {len(unwound)} without it walked by the HotSpot unwinder (vmStructs)" if unwound else ""
    if not without:
        with_flag = len(jvms) - len(unwound)
        return Check("jvm-frame-pointers", OK, f"{with_flag} JVM(s) run with -XX:+PreserveFramePointer{by_unwinder}")
    return Check(
        "jvm-frame-pointers",
        WARN,
        f"{len(without)} of {len(jvms)} JVM(s) without -XX:+PreserveFramePointer and without readable vmStructs, "
        f"their Java stacks break: {_listed(without)}{by_unwinder}",
        PFP_FIX,
    )


def python_frames_check(versions: Sequence[str]) -> Check:
    """Which CPython versions' frames the BPF walker names (docs/python-frames.md)."""
    if not versions:
        return Check("python-frames", WARN, "no CPython layout known", "Python processes keep native frames only")
    return Check(
        "python-frames",
        OK,
        f"CPython {', '.join(versions)} frames named module.qualname (file:line) (BPF walker; others: native only)",
    )


DNS_FIX = (
    "profile with profiler run --exact-inlining (sets the flag in the running JVM: exact for code compiled from "
    "then on, all of it for a JVM started during the window) or start the JVMs with "
    "-XX:+UnlockDiagnosticVMOptions -XX:+DebugNonSafepoints (Spark: spark.executor.extraJavaOptions; "
    "Flink: env.java.opts.all); docs/unwinding.md"
)


def exact_inlining_check(jvms: Sequence[tuple[int, str, bool]], debug_non_safepoints: Mapping[int, bool]) -> Check:
    """jvms as frame_pointer_check's; debug_non_safepoints: pid -> the JVM's DebugNonSafepoints now (a pid
    missing: unreadable). Without it the JIT records debug information only at safepoints and calls, and
    a method inlined into a loop between them is named after its caller (issue 51)."""
    if not jvms:
        return Check("jvm-exact-inlining", OK, "no JVM running")
    without = [(pid, what) for pid, what, _on in jvms if debug_non_safepoints.get(pid) is False]
    unknown = sum(1 for pid, _what, _on in jvms if pid not in debug_non_safepoints)
    unread = f"; {unknown} unreadable (no vmStructs or flag table)" if unknown else ""
    if not without:
        exact = len(jvms) - unknown
        return Check("jvm-exact-inlining", OK, f"{exact} JVM(s) run with DebugNonSafepoints{unread}")
    return Check(
        "jvm-exact-inlining",
        WARN,
        f"{len(without)} of {len(jvms)} JVM(s) without DebugNonSafepoints: {_listed(without)}; methods their JIT "
        f"inlines between safepoints are charged to their caller{unread}",
        DNS_FIX,
    )


def debug_non_safepoints(jvms: Sequence[tuple[int, str, bool]]) -> dict[int, bool]:
    """Each JVM's DebugNonSafepoints as its flag table holds it now (read only; unreadable ones left out)."""
    from ..unwind import debugflag

    found = {}
    for pid, _what, _on in jvms:
        try:
            memory = ProcessMemory(pid)
        except OSError:
            continue
        try:
            found[pid] = memory.read(debugflag.locate(pid, memory), 1) != b"\0"
        except (VMStructsError, OSError):
            pass
        finally:
            memory.close()
    return found


def hotspot_walkable(jvms: Sequence[tuple[int, str, bool]]) -> set[int]:
    """The JVMs (without frame pointers) whose code cache the walker can read from their vmStructs."""
    walkable = set()
    for pid, _what, on in jvms:
        if on:
            continue
        try:
            memory = ProcessMemory(pid)
        except OSError:
            continue
        try:
            if read_layout(pid, memory).code_cache is not None:
                walkable.add(pid)
        except VMStructsError:
            pass
        finally:
            memory.close()
    return walkable


def exit_code(checks: Sequence[Check]) -> int:
    return 1 if any(check.status == FAIL for check in checks) else 0


def format_table(checks: Sequence[Check]) -> str:
    width = max(len(check.check) for check in checks)
    lines = []
    for check in checks:
        lines.append(f"{check.check:<{width}}  {check.status:<4}  {check.detail}")
        if check.status != OK and check.fix:
            lines.append(f"{'':<{width}}        fix: {check.fix}")
    verdict = (
        "sampling cannot work on this host: fix the failed checks"
        if exit_code(checks)
        else "this host can be profiled"
        + (" (with the warnings above)" if any(c.status == WARN for c in checks) else "")
    )
    return "\n".join(lines + ["", verdict])


# ---------------------------------------------------------------- probing this host


def _read_int(path: str) -> int | None:
    try:
        return int(Path(path).read_text().strip())
    except (OSError, ValueError):
        return None


def _cap_eff() -> int:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("CapEff:"):
                return int(line.split()[1], 16)
    except OSError:
        pass
    return 0


def _tracefs() -> Path | None:
    for path in (Path("/sys/kernel/tracing"), Path("/sys/kernel/debug/tracing")):
        if (path / "events").is_dir():
            return path
    return None


def check_bcc() -> tuple[Check, object | None]:
    """Import bcc and compile + load a trivial program (what every later BPF step needs)."""
    try:
        import bcc
    except ImportError as exc:
        return Check(
            "bcc",
            FAIL,
            f"bcc not importable ({exc})",
            "install python3-bpfcc and run make setup (links it into the venv)",
        ), None
    try:
        from bcc import BPF

        program = BPF(
            text=b"""
int doctor_raw(struct bpf_raw_tracepoint_args *ctx) { return 0; }
int doctor_perf(struct bpf_perf_event_data *ctx) { return 0; }
"""
        )
        program.load_func(b"doctor_perf", BPF.PERF_EVENT)
    except Exception as exc:  # noqa: BLE001 - bcc raises plain Exception
        return Check(
            "bcc",
            FAIL,
            f"bcc cannot compile or load a program: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}",
            "check kernel headers (kernel-headers row) and privileges; run make setup",
        ), None
    version = getattr(bcc, "__version__", "?")
    return Check("bcc", OK, f"bcc {version}: compiled and loaded a test program"), program


def check_tracepoints(program: object | None) -> list[Check]:
    """Attach a raw tracepoint (what the profiler uses; needs no tracefs) to each tracepoint."""
    checks = []
    uses = {
        "sched_process_exec": ("exec watcher falls back to polling /proc every poll", WARN),
        "sock_send_length": ("--net cannot count sent bytes with tracepoints", WARN),
        "sock_recv_length": ("--net cannot count received bytes with tracepoints", WARN),
    }
    btf = Path("/sys/kernel/btf/vmlinux")
    btf_text = b""
    try:
        btf_text = btf.read_bytes()
    except OSError:
        pass
    for name in TRACEPOINTS:
        consequence, bad = uses[name]
        row = f"tracepoint:{name}"
        if program is None:
            known = btf_text and f"btf_trace_{name}".encode() in btf_text
            checks.append(
                Check(
                    row,
                    bad,
                    f"not attached: bcc unavailable{' (the kernel has it)' if known else ''}",
                    "fix the bcc row",
                )
            )
            continue
        try:
            program.attach_raw_tracepoint(tp=name.encode(), fn_name=b"doctor_raw")  # type: ignore[attr-defined]
            program.detach_raw_tracepoint(tp=name.encode())  # type: ignore[attr-defined]
            checks.append(Check(row, OK, "raw tracepoint attaches"))
        except Exception as exc:  # noqa: BLE001
            checks.append(
                Check(
                    row,
                    bad,
                    f"cannot attach ({exc}): {consequence}",
                    "use a kernel with this tracepoint (sched: 4.17+, sock_*_length: 6.3+)",
                )
            )
    return checks


def check_kprobes() -> Check:
    tracefs = _tracefs()
    if Path("/sys/bus/event_source/devices/kprobe").exists() or (tracefs and (tracefs / "kprobe_events").exists()):
        return Check("kprobes", OK, "kprobe PMU available")
    return Check(
        "kprobes",
        WARN,
        "no kprobe support (CONFIG_KPROBES off?): only tracepoint-based probes can be used",
        "nothing to do unless --net needs the kprobe fallback on a kernel without sock_*_length tracepoints",
    )


def check_tracefs() -> Check:
    tracefs = _tracefs()
    if tracefs is not None:
        return Check("tracefs", OK, f"mounted at {tracefs}")
    return Check(
        "tracefs",
        WARN,
        "tracefs not mounted: classic TRACEPOINT_PROBE programs and perf's tracepoint events fail"
        " (the profiler uses raw tracepoints, which do not need it)",
        "mount -t tracefs nodev /sys/kernel/tracing",
    )


def check_btf() -> Check:
    path = Path("/sys/kernel/btf/vmlinux")
    if path.exists():
        return Check("btf", OK, f"{path}")
    return Check(
        "btf",
        WARN,
        "no kernel BTF: headers must match the running kernel exactly",
        "use a kernel built with CONFIG_DEBUG_INFO_BTF=y, or install the matching linux-headers",
    )


def check_counters() -> tuple[Check, Check, Check, Check]:
    from ..errors import ProfilerError
    from ..sampling.counters import CounterGroup, nominal_cpu_hz

    group = CounterGroup()  # the default source (auto), as `profiler run` counts
    try:
        probe = group.probe()
    except (OSError, ProfilerError) as exc:
        probe = {"task-clock": f"perf_event_open unusable: {exc}"}
    try:
        clock = CounterGroup([SAMPLING_CLOCK]).probe().get(SAMPLING_CLOCK, "?")
    except (OSError, ProfilerError) as exc:
        clock = str(exc)
    if clock == "ok":
        sampling = Check("sampling-clock", OK, f"software event {SAMPLING_CLOCK} opens (drives the 99 Hz sampler)")
    else:
        sampling = Check("sampling-clock", FAIL, f"{SAMPLING_CLOCK}: {clock}", "run as root; check perf_event_paranoid")
    hz, source = nominal_cpu_hz()
    if hz:
        freq = Check("cpu-frequency", OK, f"nominal {hz / 1e9:.3f} GHz from {source} (used to estimate cycles)")
    else:
        freq = Check(
            "cpu-frequency",
            WARN,
            f"nominal frequency {source}: cycles cannot be estimated",
            "cycles stay empty without a PMU; nothing else is affected",
        )
    return pmu_check(probe), sampling, freq, check_taskstats(uses_proc=bool(group.proc_events))


def taskstats_check(unavailable: str, uses_proc: bool) -> Check:
    """Whether /proc counters (``--counters auto`` on a host without a PMU, or ``proc``) can follow exits:
    ``unavailable`` is the exit source's reason, empty when the taskstats listener registered."""
    if not unavailable:
        return Check("taskstats-exits", OK, "exit records register: a process reaped between readings keeps its counts")
    if not uses_proc:
        return Check("taskstats-exits", OK, f"{unavailable}; not needed: --counters auto counts with perf events here")
    return Check(
        "taskstats-exits",
        WARN,
        f"{unavailable}: with /proc counters (the default here) a process reaped between two readings loses "
        "what it did since the last one",
        "run the agent as root in the host's network namespace, or --counters perf (costs each context switch)",
    )


def check_taskstats(uses_proc: bool) -> Check:
    from ..sampling.taskstats import open_exit_source

    source = open_exit_source()
    try:
        return taskstats_check(source.unavailable, uses_proc)
    finally:
        source.close()


def thread_names_check(uprobe_pmu: bool, libjvm: str | None, has_symbol: bool | None) -> Check:
    """Full Java thread names need uprobes and a libjvm.so that keeps os::set_native_thread_name."""
    fallback = "stacks keep the kernel's 15-character thread names (or those Thread.print gives at the start)"
    if not uprobe_pmu:
        return Check("thread-names", WARN, f"no uprobe PMU (CONFIG_UPROBES): {fallback}", "use a kernel with uprobes")
    if libjvm is None:
        return Check("thread-names", OK, "uprobes available; no JDK on PATH to check")
    if not has_symbol:
        return Check(
            "thread-names",
            WARN,
            f"{libjvm} has no symbol os::set_native_thread_name (stripped): renames unseen, {fallback}",
            "use a JDK whose libjvm.so keeps its .symtab (Debian's, Temurin's)",
        )
    return Check("thread-names", OK, f"uprobes; {libjvm} has os::set_native_thread_name")


def check_thread_names() -> Check:
    from ..scope.threadwatch import SET_NATIVE_THREAD_NAME

    java = shutil.which("java")
    libjvm = None
    if java is not None:
        candidate = Path(os.path.realpath(java)).parent.parent / "lib" / "server" / "libjvm.so"
        libjvm = str(candidate) if candidate.exists() else None
    has_symbol = None
    if libjvm is not None:
        try:
            has_symbol = SET_NATIVE_THREAD_NAME.encode() in Path(libjvm).read_bytes()
        except OSError:
            has_symbol = False
    return thread_names_check(Path("/sys/bus/event_source/devices/uprobe").exists(), libjvm, has_symbol)


def running_jvms() -> list[tuple[int, str, bool]]:
    from ..files import procread
    from ..scope.jvm import jvm_info
    from ..scope.spes import entry_point

    found = []
    for pid in sorted(int(name) for name in os.listdir("/proc") if name.isascii() and name.isdigit()):
        try:
            info = jvm_info(pid)
        except OSError:
            continue
        if info is None:
            continue
        line = procread.cmdline(pid)  # bounded (CMDLINE_MAX_BYTES): any user sizes its own command line
        cmdline = list(line.args) if line is not None else []
        main = entry_point(cmdline).main_class or (cmdline[0] if cmdline else "java")
        # a class name shows as its simple name, a source file or program as its file name
        what = os.path.basename(main) if "/" in main or main.endswith(".java") else main.rsplit(".", 1)[-1]
        found.append((pid, what, info.preserve_frame_pointer))
    return found


def run_checks(jvms: Callable[[], list[tuple[int, str, bool]]] = running_jvms) -> list[Check]:
    euid = os.geteuid()
    cap_eff = _cap_eff()
    privileges = privilege_check(euid, cap_eff)
    checks = [privileges]
    release = platform.release()
    checks.append(headers_check(release, Path(f"/lib/modules/{release}/build"), Path("/sys/kernel/kheaders.tar.xz")))
    checks.append(check_btf())
    bcc_check, program = check_bcc()
    checks.append(bcc_check)
    try:
        checks += check_tracepoints(program)
    finally:
        if program is not None:
            program.cleanup()  # type: ignore[attr-defined]
    checks.append(check_tracefs())
    checks.append(check_kprobes())
    checks += check_counters()
    checks.append(max_stack_check(_read_int("/proc/sys/kernel/perf_event_max_stack")))
    checks.append(paranoid_check(_read_int("/proc/sys/kernel/perf_event_paranoid"), privileges.status == OK))
    checks.append(check_thread_names())
    found = jvms()
    checks.append(frame_pointer_check(found, hotspot_walkable(found)))
    checks.append(python_frames_check(supported_versions()))
    checks.append(exact_inlining_check(found, debug_non_safepoints(found)))
    return checks


def check_python_modules() -> Check:
    """bcc and psutil importable by this interpreter (no compilation: the quick part of the bcc row)."""
    missing = []
    # An emptied bcc directory still imports (a namespace package): ask for what the sampler uses.
    for module, name, package in (("bcc", "BPF", "python3-bpfcc"), ("psutil", "Process", "python3-psutil")):
        try:
            getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as exc:
            missing.append((module, package, str(exc)))
    if missing:
        names = ", ".join(f"{module} ({problem})" for module, _package, problem in missing)
        packages = " ".join(package for _module, package, _problem in missing)
        return Check("python-modules", FAIL, f"not importable: {names}", f"install {packages} for this python3")
    return Check("python-modules", OK, "bcc, psutil")


def preflight_checks() -> list[Check]:
    """What must hold before a coordinator starts this host (a second, no BPF compilation): root or
    the capabilities, bcc and psutil, kernel headers. A fail here refuses the host before sampling."""
    release = platform.release()
    return [
        privilege_check(os.geteuid(), _cap_eff()),
        check_python_modules(),
        headers_check(release, Path(f"/lib/modules/{release}/build"), Path("/sys/kernel/kheaders.tar.xz")),
    ]


class DoctorCommand:
    """Check that this host can be profiled: privileges, bcc, kernel, tracepoints, PMU, JVMs.

    Prints one row per check with ok / warn / fail and, for each non-ok row, the fix. Exit code 1
    when stack sampling cannot work here (any fail), else 0. --json prints a list of
    {check, status, detail, fix} objects (stable keys, for the coordinator).

    examples:
      sudo profiler doctor
      sudo profiler doctor --json
      sudo profiler doctor --preflight --json   # what coordinator profile asks every host before the start
    """

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the checks as a JSON list")
        parser.add_argument(
            "--preflight", action="store_true", help="only privileges, bcc/psutil and kernel headers (no compilation)"
        )

    def run(self, args: argparse.Namespace) -> int:
        checks = preflight_checks() if args.preflight else run_checks()
        if args.json:
            print(json.dumps([asdict(check) for check in checks], indent=1))
        else:
            print(format_table(checks))
        return exit_code(checks)


COMMAND = DoctorCommand
