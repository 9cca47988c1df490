"""What the coordinator ships to a host and the shell lines it runs there (pure; every value shlex-quoted).

The remote work directory is private (``mktemp -d``, mode 0700) and holds::

    pkg/profiler/…          the host agent package, unpacked from bundle.tar.gz
    application_profile.txt known_spes.txt
    out/                    the capture (``profiler run --out``)
    status.json profiler.pid profiler.log
    start.txt               the common start, written once every host is ready (profiler/run/start.py)
"""

from __future__ import annotations

import io
import shlex
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import profiler
from profiler.capture.checkpoint import CHECKPOINT_DIR
from profiler.defaults import DEFAULT_KNOWN_SPES, data_file
from profiler.run.options import RunOptions, run_argv

BUNDLE_NAME = "bundle.tar.gz"
PKG_DIR = "pkg"
OUT_DIR = "out"
STATUS_FILE = "status.json"
START_FILE = "start.txt"
PID_FILE = "profiler.pid"
LOG_FILE = "profiler.log"
PROFILE_FILE = "application_profile.txt"
KNOWN_SPES_FILE = "known_spes.txt"
TEMP_PREFIX = "taskprof"

# What `coordinator profile`/`fetch` leave on the host unless asked for everything (--fetch-all / --all):
# files the analysis and the report never read. The host's unmatched stacks are folded text (the costly
# form: every frame of every unmatched stack spelled out); the analysis derives its own unmatched.folded
# from the stack tables.
FETCH_SKIPPED = ("*_unmatched.folded",)

# Build products and caches stay home: the host compiles its own bytecode.
_EXCLUDED_SUFFIXES = (".pyc", ".pyo")
_EXCLUDED_DIRS = ("__pycache__",)


@dataclass(frozen=True)
class RemoteLayout:
    """Paths inside one host's private work directory."""

    workdir: str

    def path(self, name: str) -> str:
        return f"{self.workdir.rstrip('/')}/{name}"

    @property
    def pkg(self) -> str:
        return self.path(PKG_DIR)

    @property
    def out(self) -> str:
        return self.path(OUT_DIR)

    @property
    def status(self) -> str:
        return self.path(STATUS_FILE)

    @property
    def start(self) -> str:
        return self.path(START_FILE)

    @property
    def pid_file(self) -> str:
        return self.path(PID_FILE)

    @property
    def log(self) -> str:
        return self.path(LOG_FILE)

    @property
    def profile(self) -> str:
        return self.path(PROFILE_FILE)

    @property
    def known_spes(self) -> str:
        return self.path(KNOWN_SPES_FILE)

    @property
    def bundle(self) -> str:
        return self.path(BUNDLE_NAME)


def package_dir() -> Path:
    return Path(profiler.__file__).resolve().parent


def _keep(info: tarfile.TarInfo) -> tarfile.TarInfo | None:
    parts = Path(info.name).parts
    if any(part in _EXCLUDED_DIRS for part in parts) or info.name.endswith(_EXCLUDED_SUFFIXES):
        return None
    info.uid = info.gid = 0
    info.uname = info.gname = "root"
    return info


@lru_cache(maxsize=4)
def build_bundle(source: Path | None = None) -> bytes:
    """A tar.gz of the ``profiler`` package (Python files, bpf/*.c, agent files), built once per run."""
    source = source or package_dir()
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz", compresslevel=6) as archive:
        archive.add(str(source), arcname="profiler", filter=_keep)
        # A source tree keeps its one known_spes.txt at the top (an installed package has a copy in scope/,
        # setup.py): the host agent gets it where it looks without the tree, as from a wheel.
        spes = data_file(DEFAULT_KNOWN_SPES)
        if not (source / "scope" / KNOWN_SPES_FILE).is_file() and spes.is_file():
            archive.add(str(spes), arcname=f"profiler/scope/{KNOWN_SPES_FILE}", filter=_keep)
    return buffer.getvalue()


# The system interpreter sees Debian's python3-bpfcc; a pyenv/conda python3 first on PATH would not.
SYSTEM_PYTHON = "/usr/bin/python3"


def python_argv(python: str) -> list[str]:
    """The host's interpreter as argv words (cluster.txt ``python=``, validated there)."""
    return shlex.split(python)


def choose_python_command() -> str:
    """Prints the interpreter to use when cluster.txt has no ``python=``."""
    return f"if [ -x {SYSTEM_PYTHON} ]; then echo {SYSTEM_PYTHON}; else command -v python3; fi"


def quote_all(words: Sequence[str]) -> str:
    return " ".join(shlex.quote(str(word)) for word in words)


def sudo_prefix(needs_sudo: bool) -> str:
    return "sudo -n " if needs_sudo else ""


def make_workdir_command() -> str:
    # mktemp -d creates the directory with mode 0700; TMPDIR is honoured like ssh sessions expect.
    return f'umask 077 && mktemp -d "${{TMPDIR:-/tmp}}/{TEMP_PREFIX}.XXXXXXXX"'


@dataclass(frozen=True)
class HostFacts:
    uid: int
    sudo_ok: bool
    python: str  # absolute path, or "" when none was found
    workdir: str


def probe_command() -> str:
    """Who we are, whether ``sudo -n`` works, which python, and a fresh private work directory."""
    return (
        "id -u; "
        'if [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; then echo sudo-ok; else echo sudo-no; fi; '
        f"{{ {choose_python_command()}; }} || echo; "
        f"{make_workdir_command()}"
    )


def parse_probe(text: str) -> HostFacts | None:
    lines = [line.strip() for line in text.splitlines()]
    if len(lines) < 4 or not lines[0].isdigit() or lines[1] not in ("sudo-ok", "sudo-no"):
        return None
    workdir = lines[3]
    if not workdir.startswith("/") or f"/{TEMP_PREFIX}." not in workdir:
        return None
    return HostFacts(uid=int(lines[0]), sudo_ok=lines[1] == "sudo-ok", python=lines[2], workdir=workdir)


def unpack_command(layout: RemoteLayout) -> str:
    return (
        f"mkdir -p {shlex.quote(layout.pkg)} {shlex.quote(layout.out)} && "
        f"tar -xzf {shlex.quote(layout.bundle)} -C {shlex.quote(layout.pkg)} && rm -f {shlex.quote(layout.bundle)}"
    )


def profiler_run_args(layout: RemoteLayout, host_label: str, options: RunOptions, start_at: float | None) -> list[str]:
    """Arguments of ``profiler run`` for one host: ``options`` with the paths inside its work directory,
    its label and its clock's latest start, and the start file that may bring it forward (profiler/run/options.py
    makes the words)."""
    on_host = replace(
        options,
        out=Path(layout.out),
        profile=Path(layout.profile),
        known_spes=Path(layout.known_spes),
        host=host_label,
        status_file=Path(layout.status),
        start_at=None if start_at is None else round(start_at, 3),
        start_file=None if start_at is None else Path(layout.start),
        force=True,
    )
    return ["run", *run_argv(on_host)]


def start_file_text(start_at: float) -> str:
    """The start file's content for a start at ``start_at`` (the host's clock): profiler/run/start.py reads
    it only once whole, the newline last."""
    return f"{start_at:.3f}\n"


def start_command(layout: RemoteLayout, python: str, run_args: Sequence[str], needs_sudo: bool) -> str:
    """Start the profiler detached from the SSH session (own session, no terminal, output to a log).

    The inner shell records its own pid, then execs the interpreter, so the pid file names the profiler.
    """
    inner = (
        f"cd {shlex.quote(layout.pkg)} && echo $$ > {shlex.quote(layout.pid_file)} && "
        f"exec {quote_all(python_argv(python))} -m profiler {quote_all(run_args)}"
    )
    return (
        f"setsid nohup {sudo_prefix(needs_sudo)}sh -c {shlex.quote(inner)} "
        f"> {shlex.quote(layout.log)} 2>&1 < /dev/null &"
    )


def profiler_command(layout: RemoteLayout, python: str, args: Sequence[str], needs_sudo: bool) -> str:
    """Run a short profiler subcommand (e.g. ``doctor --json``) in the foreground."""
    return (
        f"cd {shlex.quote(layout.pkg)} && {sudo_prefix(needs_sudo)}"
        f"{quote_all(python_argv(python))} -m profiler {quote_all(args)}"
    )


def signal_command(layout: RemoteLayout, signal_name: str, needs_sudo: bool) -> str:
    """Send a signal to the profiler named in the pid file; exit status 0 only if it was alive."""
    if signal_name not in ("INT", "TERM", "KILL", "0"):
        raise ValueError(f"unexpected signal {signal_name!r}")
    flag = "-0" if signal_name == "0" else f"-{signal_name}"
    pid_file = shlex.quote(layout.pid_file)
    return (
        f'pid=$(cat {pid_file} 2>/dev/null) && [ -n "$pid" ] && {sudo_prefix(needs_sudo)}kill {flag} "$pid" 2>/dev/null'
    )


def alive_command(layout: RemoteLayout, needs_sudo: bool) -> str:
    """Exit 0 while the profiler process of this work directory exists and is not a zombie.

    Its command line must name our status file (a recycled pid is someone else), except while it
    exits: the kernel empties the command line before the process has closed its files (and BPF
    programs), so an empty one still counts as alive until the process is a zombie.
    """
    pid_file = shlex.quote(layout.pid_file)
    marker = shlex.quote(layout.status)
    return (
        f'pid=$(cat {pid_file} 2>/dev/null) && [ -n "$pid" ] && [ -r /proc/"$pid"/stat ] && '
        f'state=$(sed "s/.*) //" /proc/"$pid"/stat 2>/dev/null | cut -c1) && [ -n "$state" ] && '
        f'[ "$state" != Z ] && [ "$state" != X ] && '
        f'{{ cmd=$(tr "\\000" " " < /proc/"$pid"/cmdline 2>/dev/null); '
        f'[ -z "$cmd" ] || printf %s "$cmd" | grep -qF -- {marker}; }}'
    )


def fetch_command(layout: RemoteLayout, needs_sudo: bool, everything: bool = False) -> str:
    """The capture as a tar stream; a checkpoint journal stays on the host (only `profiler recover` there
    can use it: it names the host's files), and so do FETCH_SKIPPED's files unless ``everything``."""
    skipped = "" if everything else "".join(f" --exclude={shlex.quote('./' + p)}" for p in FETCH_SKIPPED)
    return f"{sudo_prefix(needs_sudo)}tar -C {shlex.quote(layout.out)} --exclude=./{CHECKPOINT_DIR}{skipped} -cf - ."


def check_workdir(workdir: str) -> str:
    """Refuse anything that is not one of our mktemp directories, whatever the remote (or a run.json) said."""
    if (
        not workdir.startswith("/")
        or f"/{TEMP_PREFIX}." not in workdir
        or any(c in workdir for c in "'\"\\$`\n\0")
        or workdir.endswith("/")
        or ".." in workdir
    ):
        raise ValueError(f"refusing to use {workdir!r} as a work directory")
    return workdir


def cleanup_command(layout: RemoteLayout, needs_sudo: bool, stop_wait: int = 30) -> str:
    """One round trip: stop a still-running profiler (SIGINT, then SIGKILL after ``stop_wait`` s), then
    remove the work directory."""
    workdir = check_workdir(layout.workdir)
    sudo = sudo_prefix(needs_sudo)
    alive = alive_command(layout, needs_sudo)
    return (
        f"if {alive}; then {signal_command(layout, 'INT', needs_sudo)}; i=0; "
        f"while [ $i -lt {int(stop_wait) * 5} ] && {alive}; do sleep 0.2; i=$((i+1)); done; "
        f"if {alive}; then {signal_command(layout, 'KILL', needs_sudo)}; sleep 0.5; fi; fi; "
        f"{sudo}rm -rf -- {shlex.quote(workdir)}"
    )
