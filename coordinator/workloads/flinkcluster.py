"""A local Flink standalone cluster (JobManager, TaskManagers, jobs submitted over REST) started from
the distribution inside PyPI's apache-flink wheels; everything it starts is stopped by ``stop()``.

Flink is kept out of the project's virtual environment (apache-flink pins pandas<2.3 and pyarrow<21):
``pip install --no-deps --target`` puts it under the user's cache (scripts/setup.sh does it once;
``flink_home()`` does it on first use otherwise). Only its shell scripts and jars are used.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, ClassVar

from coordinator.workloads import processes
from coordinator.workloads.sparkcluster import DEFAULT_JAVA_OPTIONS, java_home
from coordinator.workloads.ysb.javabuild import cache_dir
from profiler.errors import CapabilityError, ProfilerError

__all__ = [
    "FLINK_VERSION",
    "TASKMANAGER_MAIN_CLASS",
    "JOBMANAGER_MAIN_CLASS",
    "FlinkClusterError",
    "LocalFlinkCluster",
    "flink_home",
    "flink_cache_dir",
]

FLINK_VERSION = "2.3.0"
TASKMANAGER_MAIN_CLASS = "org.apache.flink.runtime.taskexecutor.TaskManagerRunner"
JOBMANAGER_MAIN_CLASS = "org.apache.flink.runtime.entrypoint.StandaloneSessionClusterEntrypoint"
_PACKAGES = (f"apache-flink=={FLINK_VERSION}", f"apache-flink-libraries=={FLINK_VERSION}")
_START_TIMEOUT_S = 180.0  # a loaded 2-core machine took 90 s
_STOP_GRACE_S = 10.0
# How soon a TaskManager that could not reach the ResourceManager (not started yet) tries again: Flink's
# default is 10 s, and the TaskManagers are started beside the JobManager (LocalFlinkCluster.start)
REGISTRATION_RETRY = "1 s"


class FlinkClusterError(ProfilerError):
    """The local Flink cluster did not start, or a job could not be submitted or did not run."""

    exit_code = 10


def flink_cache_dir() -> Path:
    """Where Flink is installed when FLINK_HOME is not set (the same cache as the YSB jars)."""
    return cache_dir() / f"flink-{FLINK_VERSION}"


def _is_flink_home(path: Path) -> bool:
    return (path / "bin" / "jobmanager.sh").exists() and any((path / "lib").glob("flink-dist-*.jar"))


def flink_home(install: bool = True, say: Any = None) -> Path:
    """FLINK_HOME from the environment, else the pip-installed distribution in the cache (installed with
    pip from PyPI on first use when ``install``; needs network access once)."""
    env = os.environ.get("FLINK_HOME")
    if env:
        if not _is_flink_home(Path(env)):
            raise CapabilityError(f"FLINK_HOME={env}: no bin/jobmanager.sh and lib/flink-dist-*.jar there")
        return Path(env)
    target = flink_cache_dir()
    home = target / "pyflink"
    if _is_flink_home(home):
        return home
    if not install:
        raise CapabilityError(f"{home}: Flink {FLINK_VERSION} is not installed; run scripts/setup.sh")
    if say is not None:
        say(f"installing Flink {FLINK_VERSION} from PyPI into {target} (once; about 350 MB)")
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(partial), *_PACKAGES],
        capture_output=True, text=True, timeout=1800,
    )
    if result.returncode != 0 or not _is_flink_home(partial / "pyflink"):
        shutil.rmtree(partial, ignore_errors=True)
        tail = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise CapabilityError(f"pip could not install {' '.join(_PACKAGES)}: {tail}; run scripts/setup.sh")
    shutil.rmtree(target, ignore_errors=True)
    partial.replace(target)  # another installer may have won the race: both are complete copies
    return home


def _shipped_java_opts(config_text: str) -> str:
    """``env.java.opts.all`` of the distribution's config.yaml (the --add-opens Flink needs on Java 17)."""
    match = re.search(r"^\s+all:\s*(--add-\S.*)$", config_text, re.MULTILINE)
    return match.group(1).strip() if match else ""


def _yaml_scalar(value: str) -> str:
    return json.dumps(value)  # a JSON string is a valid YAML double-quoted scalar


def _multipart(field_name: str, path: Path) -> tuple[bytes, str]:
    boundary = uuid.uuid4().hex
    head = (
        f"--{boundary}\r\nContent-Disposition: form-data; name=\"{field_name}\"; filename=\"{path.name}\"\r\n"
        "Content-Type: application/x-java-archive\r\n\r\n"
    ).encode()
    return head + path.read_bytes() + f"\r\n--{boundary}--\r\n".encode(), f"multipart/form-data; boundary={boundary}"


@dataclass
class FlinkProcess:
    process: subprocess.Popen[bytes]
    log_path: Path
    role: str  # "jobmanager" or "taskmanager"


@dataclass
# What both local clusters do alike lives in processes.py (spawning into process groups, waiting with
# poll_until, stopping with stop_all, releasing the scratch directory); what stays here apart from
# sparkcluster.py is engine-specific and only looks alike: Flink is configured by config.yaml and asked
# over its REST API, Spark by environment variables and its Master's web UI and log lines.
class LocalFlinkCluster(processes.ScratchLifecycle):
    """Context manager: a standalone JobManager and ``taskmanagers`` TaskManagers on 127.0.0.1.

    Each TaskManager has ``slots`` slots; every JVM runs with -XX:+PreserveFramePointer
    (``env.java.opts.jobmanager``/``taskmanager``). Ports are free loopback ports. ``submit_jar()`` runs
    a job over the REST API; ``stop()`` kills everything it started. Logs stay in ``tmp_dir`` (given
    ``log_dir``, or a temporary directory kept when FLINK_LOCAL_KEEP_LOGS is set, start-up failed or
    the ``with`` block ended with an error other than Ctrl-C).
    """

    not_started: ClassVar[type[Exception]] = FlinkClusterError

    taskmanagers: int = 2
    slots: int = 1
    taskmanager_memory: str = "1280m"
    jobmanager_memory: str = "1024m"
    log_dir: Path | None = None
    start_timeout: float = _START_TIMEOUT_S
    java_options: str = DEFAULT_JAVA_OPTIONS
    taskmanager_java_options: str = ""  # added to java_options in the TaskManagers only
    extra_config: Mapping[str, str] = field(default_factory=dict)

    rest_port: int = field(init=False, default=0)
    rpc_port: int = field(init=False, default=0)
    jobmanager: FlinkProcess | None = field(init=False, default=None)
    workers: list[FlinkProcess] = field(init=False, default_factory=list)
    jobs: list[str] = field(init=False, default_factory=list)
    _keep_logs: bool = field(init=False, default=False)
    _env: dict[str, str] = field(init=False, default_factory=dict)
    _home: Path | None = field(init=False, default=None)

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        # An error (a job that failed, a TaskManager that died) names files in tmp_dir: keep them.
        if exc_type is not None and not issubclass(exc_type, KeyboardInterrupt):
            self._keep_logs = True
        self.stop()

    @property
    def home(self) -> Path:
        if self._home is None:
            self._home = flink_home()
        return self._home

    @property
    def rest_url(self) -> str:
        return f"http://127.0.0.1:{self.rest_port}"

    # --- lifecycle -------------------------------------------------------------------------------

    def start(self) -> LocalFlinkCluster:
        if self.jobmanager is not None:
            return self
        home = self.home
        self.make_scratch(self.log_dir, "flink-local-")
        self.rest_port = processes.free_port()
        self.rpc_port = processes.free_port()
        conf_dir = self._write_conf(home)
        self._env = dict(os.environ)
        self._env.update({"FLINK_CONF_DIR": str(conf_dir), "JAVA_HOME": str(java_home()), "FLINK_HOME": str(home)})
        for key in ("HADOOP_CLASSPATH", "FLINK_ENV_JAVA_OPTS", "FLINK_LOG_DIR", "FLINK_PID_DIR"):
            self._env.pop(key, None)
        atexit.register(self.stop)
        try:
            # The TaskManagers start beside the JobManager: one that finds no ResourceManager yet retries
            # after cluster.registration.error-delay (REGISTRATION_RETRY, not Flink's 10 s), so their JVMs'
            # start-up overlaps the JobManager's instead of following its REST API.
            self.jobmanager = self._spawn("jobmanager", self.tmp_dir / "jobmanager.out")
            for index in range(self.taskmanagers):
                self.workers.append(self._spawn("taskmanager", self.tmp_dir / f"taskmanager{index + 1}.out"))
            self._wait_rest()
            self.wait_for_taskmanagers(self.taskmanagers)
        except BaseException:
            self._keep_logs = True
            self.stop()
            raise
        return self

    def config(self) -> dict[str, str]:
        """The flat config.yaml keys this cluster runs with (``extra_config`` last)."""
        fp = self.java_options
        settings = {
            "jobmanager.rpc.address": "127.0.0.1",
            "jobmanager.rpc.port": str(self.rpc_port),
            "jobmanager.bind-host": "127.0.0.1",
            "jobmanager.memory.process.size": self.jobmanager_memory,
            "taskmanager.bind-host": "127.0.0.1",
            "taskmanager.host": "127.0.0.1",
            "taskmanager.numberOfTaskSlots": str(self.slots),
            "taskmanager.memory.process.size": self.taskmanager_memory,
            "parallelism.default": str(self.taskmanagers * self.slots),
            "rest.address": "127.0.0.1",
            "rest.bind-address": "127.0.0.1",
            "rest.port": str(self.rest_port),
            "env.java.opts.jobmanager": fp,
            "env.java.opts.taskmanager": f"{fp} {self.taskmanager_java_options}".strip(),
            "env.log.dir": str(self.tmp_dir),
            "env.pid.dir": str(self.tmp_dir),
            "io.tmp.dirs": str(self.tmp_dir / "io"),
            "web.tmpdir": str(self.tmp_dir / "web"),
            "web.upload.dir": str(self.tmp_dir / "web"),
            "blob.storage.directory": str(self.tmp_dir / "blobs"),
            "cluster.registration.error-delay": REGISTRATION_RETRY,
        }
        settings.update(self.extra_config)
        return settings

    def _write_conf(self, home: Path) -> Path:
        """A private copy of the distribution's conf directory with our config.yaml (flat keys)."""
        shipped = home / "conf"
        conf_dir = self.tmp_dir / "conf"
        shutil.copytree(shipped, conf_dir, dirs_exist_ok=True)
        for sub in ("io", "web", "blobs"):
            (self.tmp_dir / sub).mkdir(exist_ok=True)
        settings = {"env.java.opts.all": _shipped_java_opts((shipped / "config.yaml").read_text())}
        settings.update(self.config())
        lines = ["# written by coordinator.workloads.flinkcluster.LocalFlinkCluster"]
        lines += [f"{key}: {_yaml_scalar(value)}" for key, value in settings.items() if value != ""]
        (conf_dir / "config.yaml").write_text("\n".join(lines) + "\n")
        (conf_dir / "workers").write_text("")
        (conf_dir / "masters").write_text("")
        return conf_dir

    def _spawn(self, role: str, log_path: Path) -> FlinkProcess:
        # start-foreground: the script execs flink-console.sh, which execs the JVM, so the child we
        # hold is the JVM itself (its own process group, SIGTERM when we die).
        argv = [str(self.home / "bin" / f"{role}.sh"), "start-foreground"]
        process = processes.spawn_logged(argv, log_path, self._env, self.tmp_dir)
        return FlinkProcess(process, log_path, role)

    def rest(self, path: str, method: str = "GET", body: bytes | None = None, content_type: str = "") -> Any:
        """One REST call to the JobManager; the decoded JSON answer."""
        request = urllib.request.Request(self.rest_url + path, data=body, method=method)
        if content_type:
            request.add_header("Content-Type", content_type)
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(request, timeout=60) as response:
            raw = response.read()
        return json.loads(raw) if raw else None

    def _check_alive(self) -> None:
        for proc in ([self.jobmanager] if self.jobmanager else []) + self.workers:
            if proc.process.poll() is not None:
                raise FlinkClusterError(
                    f"{proc.log_path}: Flink {proc.role} exited with code {proc.process.returncode}; "
                    f"its log ends: {processes.log_tail(proc.log_path)}"
                )

    def _wait_rest(self) -> None:
        def up() -> bool | None:
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                if "flink-version" in self.rest("/config"):
                    return True
            return None

        processes.poll_until(
            up,
            self.start_timeout,
            lambda: FlinkClusterError(
                f"{self.tmp_dir}: Flink JobManager REST API not up after {self.start_timeout:.0f} s; "
                "read jobmanager.out"
            ),
            self._check_alive,
        )

    def registered_taskmanagers(self) -> int:
        try:
            listing = self.rest("/taskmanagers")
        except (OSError, ValueError, urllib.error.URLError):
            return 0
        return len(listing.get("taskmanagers", [])) if isinstance(listing, dict) else 0

    def wait_for_taskmanagers(self, count: int, timeout: float | None = None) -> None:
        processes.poll_until(
            lambda: True if self.registered_taskmanagers() >= count else None,
            timeout or self.start_timeout,
            lambda: FlinkClusterError(
                f"{self.tmp_dir}: only {self.registered_taskmanagers()} of {count} TaskManagers registered; "
                "read taskmanager*.out"
            ),
            self._check_alive,
        )

    def add_taskmanager(self, wait: bool = True) -> FlinkProcess:
        """Start one more TaskManager; with ``wait`` return once the JobManager lists it."""
        if self.jobmanager is None:
            raise FlinkClusterError("LocalFlinkCluster: not started; call start() first")
        worker = self._spawn("taskmanager", self.tmp_dir / f"taskmanager{len(self.workers) + 1}.out")
        self.workers.append(worker)
        if wait:
            self.wait_for_taskmanagers(len(self.workers))
        return worker

    def remove_taskmanager(self, worker: FlinkProcess) -> None:
        """Stop one TaskManager (its process group); the JobManager notices after its heartbeat timeout."""
        processes.terminate_group(worker.process, _STOP_GRACE_S)
        self.workers.remove(worker)

    # --- jobs ------------------------------------------------------------------------------------

    def submit_jar(self, jar: Path, entry_class: str, args: Sequence[str] = (), parallelism: int = 0) -> str:
        """Upload ``jar`` and run ``entry_class`` with ``args`` (its main() runs in the JobManager);
        returns the job id. No client JVM: the REST API does what ``flink run -d`` would."""
        body, content_type = _multipart("jarfile", jar)
        try:
            uploaded = self.rest("/jars/upload", "POST", body, content_type)
            jar_id = Path(str(uploaded["filename"])).name
            request: dict[str, Any] = {"entryClass": entry_class, "programArgsList": list(args)}
            if parallelism:
                request["parallelism"] = parallelism
            started = self.rest(f"/jars/{jar_id}/run", "POST", json.dumps(request).encode(), "application/json")
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[-500:]
            raise FlinkClusterError(f"{jar}: Flink refused the job ({exc.code}): {detail}") from None
        except (OSError, ValueError, KeyError) as exc:
            raise FlinkClusterError(f"{jar}: could not submit the job over {self.rest_url}: {exc}") from None
        job_id = str(started["jobid"])
        self.jobs.append(job_id)
        return job_id

    def job(self, job_id: str) -> dict[str, Any]:
        """``/jobs/<id>``: state and per-vertex read/write records."""
        answer = self.rest(f"/jobs/{job_id}")
        return answer if isinstance(answer, dict) else {}

    def wait_for_job_running(self, job_id: str, timeout: float = 120.0) -> dict[str, Any]:
        """Until the job and all its vertices are RUNNING; fails when the job fails first."""

        def running() -> dict[str, Any] | None:
            with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
                state = self.job(job_id)
                if state.get("state") in ("FAILED", "CANCELED", "FINISHED"):
                    raise FlinkClusterError(
                        f"Flink job {job_id} is {state.get('state')}: {self.job_exception(job_id)}; "
                        f"read {self.tmp_dir}/*.out"
                    )
                vertices = state.get("vertices", [])
                if state.get("state") == "RUNNING" and vertices and all(
                    v.get("status") == "RUNNING" for v in vertices
                ):
                    return state
            return None

        return processes.poll_until(
            running,
            timeout,
            lambda: FlinkClusterError(f"Flink job {job_id} not running after {timeout:.0f} s; read {self.tmp_dir}"),
            self._check_alive,
            every=0.5,
        )

    def job_exception(self, job_id: str) -> str:
        with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
            answer = self.rest(f"/jobs/{job_id}/exceptions")
            root = (answer.get("exceptionHistory", {}).get("entries") or [{}])[0] if isinstance(answer, dict) else {}
            text = str(root.get("stacktrace") or root.get("exceptionName") or "")
            return text.strip().splitlines()[0] if text.strip() else "no exception recorded"
        return "exceptions not readable"

    def cancel(self, job_id: str) -> None:
        with contextlib.suppress(OSError, ValueError, urllib.error.URLError):
            self.rest(f"/jobs/{job_id}?mode=cancel", "PATCH")

    # --- processes -------------------------------------------------------------------------------

    def jobmanager_pid(self) -> int | None:
        return self.jobmanager.process.pid if self.jobmanager is not None else None

    def taskmanager_pids(self) -> list[int]:
        """PIDs of the TaskManager JVMs (the started children exec into them), sorted."""
        return sorted(w.process.pid for w in self.workers if w.process.poll() is None)

    def all_pids(self) -> list[int]:
        """Every live process this cluster started and their descendants."""
        roots = ([self.jobmanager.process.pid] if self.jobmanager else []) + [w.process.pid for w in self.workers]
        return processes.live_process_tree(roots)

    def stop(self) -> None:
        """Kill the TaskManagers, then the JobManager, and wait for every one. Idempotent."""
        jobmanager = [self.jobmanager.process] if self.jobmanager is not None else []
        processes.stop_all([*(w.process for w in reversed(self.workers)), *jobmanager], self.all_pids(), _STOP_GRACE_S)
        self.jobmanager = None
        self.workers.clear()
        self.jobs.clear()
        keep = self._keep_logs or bool(os.environ.get("FLINK_LOCAL_KEEP_LOGS"))
        self.release_scratch(keep)
