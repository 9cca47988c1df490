"""The remote shell lines of coordinator/remote/deploy.py run in a real POSIX sh (no SSH needed)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from coordinator.remote import deploy


def test_probe_and_cleanup_lines_run_in_sh(tmp_path: Path) -> None:
    # The shell lines are plain POSIX sh: run them here (no SSH) against a private TMPDIR.
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    probe = subprocess.run(["sh", "-c", deploy.probe_command()], capture_output=True, text=True, env=env, timeout=30)
    facts = deploy.parse_probe(probe.stdout)
    assert facts is not None and Path(facts.workdir).parent == tmp_path
    assert Path(facts.workdir).stat().st_mode & 0o777 == 0o700
    done = subprocess.run(
        ["sh", "-c", deploy.cleanup_command(deploy.RemoteLayout(facts.workdir), False)], env=env, timeout=30
    )
    assert done.returncode == 0 and not Path(facts.workdir).exists()


def test_alive_check_follows_the_profiler_process(tmp_path: Path) -> None:
    env = {"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"}
    layout = deploy.RemoteLayout(str(tmp_path / "taskprof.test"))
    Path(layout.workdir).mkdir()
    alive = deploy.alive_command(layout, needs_sudo=False)

    def check() -> int:
        return subprocess.run(["sh", "-c", alive], env=env, timeout=30).returncode

    assert check() != 0  # no pid file yet
    # a process naming our status file on its command line is ours
    ours = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", layout.status])
    Path(layout.pid_file).write_text(f"{ours.pid}\n")
    time.sleep(0.3)
    assert check() == 0
    ours.kill()
    time.sleep(0.3)
    assert check() != 0  # a zombie holds nothing: not alive
    ours.wait()
    assert check() != 0
    # a recycled pid (another process) is not ours
    other = subprocess.Popen(["sleep", "60"])
    Path(layout.pid_file).write_text(f"{other.pid}\n")
    try:
        assert check() != 0
    finally:
        other.kill()
        other.wait()
