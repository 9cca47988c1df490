"""Tenants whose REST API is hostile (issue 46, the deadlines' class), as ``nobody``, beside an honest JVM: two
processes the scope files as Spark drivers (their script is named after SparkSubmit), one answering every GET
a byte a second (a per-recv timeout would read it for an hour), one with a JSON list without end. The agent's
event counter and plan collector ask them during the window: the run ends on time (before rest.Endpoints, the
trickle alone kept it ~90 s past an 8 s window), each tenant gets one line naming what was refused, and the
honest JVM is profiled."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from profiler.capture.read import pid_stacks_file, read_meta, read_stack_counts
from profiler.engines.events import FINISH_SECONDS
from profiler.engines.rest import REST_MAX_BYTES
from tests.fixtures.hostile import RestTenant
from tests.fixtures.privileges import requires

pytestmark = requires("root", "setpriv", "system-python")

REPO = Path(__file__).resolve().parents[2]
DURATION = 8
# the window, then the event counter's and the plan collector's last readings (each FINISH_SECONDS at most for
# requests in flight and as much for the last reading), symbolization and writing: 107 s before the bounds
RUN_LIMIT = 60.0


def test_trickling_and_endless_rest_answers_cost_the_run_its_deadline_once(
    rest_tenant: Callable[[str], RestTenant], start_cpu_split_jvm, tmp_path: Path
) -> None:
    # GIVEN two tenant "drivers" (a trickle, an endless body) and an honest JVM
    trickle, endless = rest_tenant("trickle"), rest_tenant("endless")
    honest = start_cpu_split_jvm(threads=1)
    # WHEN root profiles the honest JVM, the scope finding the tenants in its scan of the host
    out = tmp_path / "cap"
    argv = [sys.executable, "-m", "profiler", "run", "--duration", str(DURATION), "--pid", str(honest.pid)]
    started = time.monotonic()
    done = subprocess.run([*argv, "--out", str(out), "--force"], capture_output=True, text=True, timeout=300, cwd=REPO)
    elapsed = time.monotonic() - started
    # THEN the run ended normally and on time
    assert done.returncode == 0, done.stderr[-2000:]
    meta = read_meta(out)
    assert meta.stopped_by == "duration" and meta.end_time - meta.start_time < DURATION + 5, meta
    assert elapsed < RUN_LIMIT, (elapsed, meta.warnings)
    plans = json.loads((out / "spark.json").read_text())
    assert plans["plans"] == [] and plans["read_seconds"] <= FINISH_SECONDS + 1, plans
    # AND each tenant got one line, naming what was refused: the trickle's answer unfinished, the endless one's size
    lines = {
        tenant.mode: [w for w in meta.warnings if f"pid {tenant.pid} " in w or f"pid {tenant.pid}:" in w]
        for tenant in (trickle, endless)
    }
    assert [len(found) for found in lines.values()] == [1, 1], meta.warnings
    assert lines["trickle"][0].startswith(f"events: the spark REST API of pid {trickle.pid} did not answer")
    assert f"http://127.0.0.1:{trickle.port}/api/v1/applications" in lines["trickle"][0]
    assert "no complete answer" in lines["trickle"][0], lines
    assert f"over the limit of {REST_MAX_BYTES} bytes" in lines["endless"][0], lines
    assert not [w for w in meta.warnings if f"pid {honest.pid}:" in w], meta.warnings
    # AND the honest JVM was profiled, its Java frames named
    stacks = pid_stacks_file(out, honest.pid)
    assert stacks is not None and "com.example.CpuSplit::burn" in "\n".join(read_stack_counts(stacks))
