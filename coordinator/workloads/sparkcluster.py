"""A local Spark standalone cluster (Master, Workers, submitted apps) started from pyspark's bundled Spark.

Used by the demo, the benchmarks and the integration tests; everything it starts is stopped by ``stop()``.
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
import time
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

import psutil

from coordinator.workloads.processes import (
    ScratchLifecycle,
    die_with_parent,
    first_error_line,
    free_port,
    live_process_tree,
    log_tail,
    poll_until,
    spawn_logged,
    stop_all,
    terminate_group,
)
from profiler.errors import CapabilityError, ProfilerError

__all__ = [
    "LocalSparkCluster",
    "SparkClusterError",
    "SparkSubmitProcess",
    "WorkerProcess",
    "spark_home",
    "java_home",
    "EXECUTOR_MAIN_CLASS",
    "DEFAULT_JAVA_OPTIONS",
]

EXECUTOR_MAIN_CLASS = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
# Frame pointers let the eBPF sampler walk JIT-compiled Java frames.
DEFAULT_JAVA_OPTIONS = "-XX:+PreserveFramePointer"
_START_TIMEOUT_S = 120.0
_STOP_GRACE_S = 10.0


class SparkClusterError(ProfilerError):
    """The local Spark cluster did not start, or an app did not reach its ready line."""

    exit_code = 10


def spark_home() -> Path:
    """SPARK_HOME of the pyspark package in this interpreter (pip's pyspark ships all of Spark's jars)."""
    try:
        import pyspark  # heavy, imported only when a cluster is wanted
    except ImportError as exc:
        raise CapabilityError(
            "pyspark is not installed in this Python; install the coordinator extras: pip install -e '.[coordinator]'"
        ) from exc
    home = Path(pyspark.__file__).resolve().parent
    if not (home / "bin" / "spark-class").exists():
        raise CapabilityError(f"{home}: pyspark has no bin/spark-class; reinstall pyspark from PyPI")
    return home


def java_home() -> Path:
    """JAVA_HOME from the environment, else the directory of the ``java`` on PATH (symlinks resolved)."""
    env = os.environ.get("JAVA_HOME")
    if env and (Path(env) / "bin" / "java").exists():
        return Path(env)
    java = shutil.which("java")
    if java is None:
        raise CapabilityError("no java on PATH and JAVA_HOME unset; install a JDK 17+ (openjdk-17-jdk-headless)")
    return Path(os.path.realpath(java)).parent.parent


def _wait_for_file_pattern(
    path: Path,
    pattern: re.Pattern[str],
    timeout: float,
    process: subprocess.Popen[bytes] | None,
    what: str,
    log_hint: Path | None = None,
) -> re.Match[str]:
    def found() -> re.Match[str] | None:
        return pattern.search(path.read_text(errors="replace") if path.exists() else "")

    def alive() -> None:
        if process is not None and process.poll() is not None and found() is None:
            logs = [log_hint, path] if log_hint is not None else [path]
            cause = first_error_line(logs) or f"its log ends: {log_tail(logs[0])}"
            raise SparkClusterError(
                f"{logs[0]}: {what} exited with code {process.returncode} before it was ready: {cause}"
            )

    return poll_until(
        found,
        timeout,
        lambda: SparkClusterError(f"{path}: {what} not ready after {timeout:.0f} s; read the log or raise the timeout"),
        alive,
        every=0.2,
    )


class SparkSubmitProcess(subprocess.Popen):  # type: ignore[type-arg]
    """A ``spark-submit`` process whose stdout and stderr go to files in the cluster's log directory."""

    stdout_path: Path
    stderr_path: Path

    def output(self) -> str:
        return self.stdout_path.read_text(errors="replace") if self.stdout_path.exists() else ""

    def wait_for_output(self, pattern: str, timeout: float = 120.0) -> re.Match[str]:
        """Block until ``pattern`` (a regex) appears on the app's stdout; fail if the app exits first."""
        return _wait_for_file_pattern(
            self.stdout_path, re.compile(pattern, re.MULTILINE), timeout, self, "spark app", log_hint=self.stderr_path
        )


@dataclass
class WorkerProcess:
    process: subprocess.Popen[bytes]
    log_path: Path
    work_dir: Path
    cores: int
    memory: str
    webui_port: int = 0


@dataclass(frozen=True)
class WorkerHost:
    """Where a Worker runs when it is not beside the Master: the words that enter its host
    (coordinator/workloads/nshosts.py's ``enter()``) and the address it binds there."""

    address: str
    prefix: tuple[str, ...]


@dataclass
class LocalSparkCluster(ScratchLifecycle):
    """Context manager: a standalone Master and one Worker on 127.0.0.1, on free ports.

    With ``worker_hosts``, one Worker of ``worker_cores`` cores in each of those hosts instead (its
    executors there too), the Master and the driver on ``bind_address``, an address the hosts reach
    (the namespaced hosts' bridge); the scratch directory must then be one the hosts see (not /tmp).

    ``submit()`` runs spark-submit against it (frame pointers on in driver and executors);
    ``add_worker()`` starts another Worker later; ``stop()`` kills everything it started.
    """

    not_started: ClassVar[type[Exception]] = SparkClusterError

    worker_cores: int = 1
    worker_memory: str = "1g"
    daemon_memory: str = "256m"
    log_dir: Path | None = None
    start_timeout: float = _START_TIMEOUT_S
    extra_env: Mapping[str, str] = field(default_factory=dict)
    bind_address: str = "127.0.0.1"
    worker_hosts: Sequence[WorkerHost] = ()

    master_url: str = field(init=False, default="")
    master_port: int = field(init=False, default=0)
    master_webui_port: int = field(init=False, default=0)
    workers: list[WorkerProcess] = field(init=False, default_factory=list)
    apps: list[SparkSubmitProcess] = field(init=False, default_factory=list)
    _master: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _env: dict[str, str] = field(init=False, default_factory=dict)
    _spark_home: Path | None = field(init=False, default=None)
    _app_counter: int = field(init=False, default=0)

    # --- lifecycle -------------------------------------------------------------------------------

    @property
    def spark_home(self) -> Path:
        if self._spark_home is None:
            self._spark_home = spark_home()
        return self._spark_home

    def start(self, wait: bool = True) -> LocalSparkCluster:
        """The Master, then its Worker. Without ``wait``, return once the Master is ALIVE, the Worker's
        JVM still starting: an app submitted now starts its driver beside it; call wait_started() before
        relying on the Worker."""
        if self._master is not None:
            return self
        self.make_scratch(self.log_dir, "spark-local-")
        self._env = self._build_env()
        atexit.register(self.stop)
        try:
            # The Worker's JVM starts as soon as the Master's URL is known, beside the Master's web UI and
            # election: the two JVMs' start-up overlaps instead of adding up. (The Master elects itself in
            # its onStart, within a second of its URL line; a Worker's JVM takes longer to connect.)
            self._start_master()
            hosts: Sequence[WorkerHost | None] = self.worker_hosts or [None]  # None: beside the Master
            for host in hosts:
                self._spawn_worker(self.worker_cores, self.worker_memory, host)
            self._wait_master_ready()
        except BaseException:
            self.stop()
            raise
        if wait:
            self.wait_started()
        return self

    def wait_started(self) -> None:
        """Until the Workers started by start() have their web UI and the Master lists them ALIVE."""
        try:
            for worker in self.workers:
                self._wait_worker_ui(worker)
            self.wait_for_workers(len(self.workers))
        except BaseException:
            self.stop()
            raise

    def _build_env(self) -> dict[str, str]:
        conf_dir = self.tmp_dir / "conf"
        conf_dir.mkdir(exist_ok=True)
        env = dict(os.environ)
        env.update(
            {
                "SPARK_HOME": str(self.spark_home),
                "JAVA_HOME": str(java_home()),
                # An empty conf dir: no spark-defaults.conf or spark-env.sh from elsewhere leaks in.
                "SPARK_CONF_DIR": str(conf_dir),
                "SPARK_LOG_DIR": str(self.tmp_dir),
                "SPARK_LOCAL_DIRS": str(self.tmp_dir / "local"),
                "SPARK_LOCAL_IP": self.bind_address,
                "SPARK_MASTER_HOST": self.bind_address,
                "SPARK_DAEMON_MEMORY": self.daemon_memory,
                "SPARK_DAEMON_JAVA_OPTS": f"{DEFAULT_JAVA_OPTIONS} -XX:+UseSerialGC",
                "SPARK_NO_DAEMONIZE": "1",
                "PYSPARK_PYTHON": sys.executable,
                "PYSPARK_DRIVER_PYTHON": sys.executable,
                "PYTHONUNBUFFERED": "1",
            }
        )
        env.pop("PYSPARK_SUBMIT_ARGS", None)
        env.update(self.extra_env)
        (self.tmp_dir / "local").mkdir(exist_ok=True)
        return env

    def _spawn(self, argv: Sequence[str], log_path: Path) -> subprocess.Popen[bytes]:
        return spawn_logged(argv, log_path, self._env, self.tmp_dir)

    def _start_master(self) -> None:
        spark_class = str(self.spark_home / "bin" / "spark-class")
        log_path = self.tmp_dir / "master.log"
        self._master = self._spawn(
            [
                spark_class,
                "org.apache.spark.deploy.master.Master",
                "--host",
                self.bind_address,
                "--port",
                str(free_port()),
                "--webui-port",
                str(free_port()),
            ],
            log_path,
        )
        # Spark moves to the next port when one is taken, so read the ports it really bound.
        url = _wait_for_file_pattern(
            log_path, re.compile(r"Starting Spark master at (spark://[\d.]+:(\d+))"), self.start_timeout,
            self._master, "Spark master",
        )
        self.master_url = url.group(1)
        self.master_port = int(url.group(2))

    def _wait_master_ready(self) -> None:
        """The Master's web UI port (wait_for_workers reads its JSON) and its election."""
        assert self._master is not None
        log_path = self.tmp_dir / "master.log"
        ui = _wait_for_file_pattern(
            log_path, re.compile(r"MasterWebUI.*started at http://[\w.\-]+:(\d+)"), self.start_timeout,
            self._master, "Spark master web UI",
        )
        self.master_webui_port = int(ui.group(1))
        _wait_for_file_pattern(
            log_path, re.compile(r"I have been elected leader|New state: ALIVE"), self.start_timeout,
            self._master, "Spark master election",
        )

    def _start_worker(self, cores: int, memory: str) -> WorkerProcess:
        worker = self._spawn_worker(cores, memory)
        self._wait_worker_ui(worker)
        return worker

    def _spawn_worker(self, cores: int, memory: str, host: WorkerHost | None = None) -> WorkerProcess:
        index = len(self.workers) + 1
        work_dir = self.tmp_dir / f"worker{index}"
        work_dir.mkdir(exist_ok=True)
        log_path = self.tmp_dir / f"worker{index}.log"
        address = host.address if host is not None else self.bind_address
        env = {**self._env, "SPARK_LOCAL_IP": address}  # its executors inherit it
        process = spawn_logged(
            [
                *(host.prefix if host is not None else ()),
                str(self.spark_home / "bin" / "spark-class"),
                "org.apache.spark.deploy.worker.Worker",
                self.master_url,
                "--host",
                address,
                "--cores",
                str(cores),
                "--memory",
                memory,
                "--webui-port",
                str(free_port()),
                "--work-dir",
                str(work_dir),
            ],
            log_path,
            env,
            self.tmp_dir,
        )
        worker = WorkerProcess(process=process, log_path=log_path, work_dir=work_dir, cores=cores, memory=memory)
        self.workers.append(worker)
        return worker

    def _wait_worker_ui(self, worker: WorkerProcess) -> None:
        ui = _wait_for_file_pattern(
            worker.log_path, re.compile(r"WorkerWebUI.*started at http://[\w.\-]+:(\d+)"), self.start_timeout,
            worker.process, "Spark worker",
        )
        worker.webui_port = int(ui.group(1))

    def add_worker(self, cores: int = 1, memory: str = "1g", wait: bool = True) -> WorkerProcess:
        """Start one more Worker; with ``wait`` return once the Master lists it ALIVE."""
        if self._master is None:
            raise SparkClusterError("LocalSparkCluster: not started; call start() first")
        worker = self._start_worker(cores, memory)
        if wait:
            self.wait_for_workers(len(self.workers))
        return worker

    def remove_worker(self, worker: WorkerProcess) -> None:
        """Stop one Worker and the executors it runs (its process group); the others keep running."""
        terminate_group(worker.process, _STOP_GRACE_S)
        self.workers.remove(worker)

    def master_state(self) -> dict[str, object]:
        """The Master's JSON status (workers, active apps), from its web UI's ``/json/``."""
        url = f"http://{self.bind_address}:{self.master_webui_port}/json/"
        with urllib.request.urlopen(url, timeout=5) as response:
            state: dict[str, object] = json.loads(response.read().decode())
        return state

    def alive_workers(self) -> int:
        try:
            state = self.master_state()
        except (OSError, urllib.error.URLError, ValueError):
            return 0
        workers = state.get("workers", [])
        return sum(1 for w in workers if isinstance(w, dict) and w.get("state") == "ALIVE") if isinstance(
            workers, list
        ) else 0

    def _check_workers(self) -> None:
        for worker in self.workers:
            if worker.process.poll() is not None:
                raise SparkClusterError(
                    f"{worker.log_path}: Spark worker exited with code {worker.process.returncode}; read the log"
                )

    def wait_for_workers(self, count: int, timeout: float | None = None) -> None:
        poll_until(
            lambda: True if self.alive_workers() >= count else None,
            timeout or self.start_timeout,
            lambda: SparkClusterError(
                f"{self.tmp_dir}: only {self.alive_workers()} of {count} Spark workers ALIVE; read worker*.log"
            ),
            self._check_workers,
        )

    # --- apps ------------------------------------------------------------------------------------

    def submit(
        self,
        app: str | os.PathLike[str],
        args: Sequence[str] = (),
        conf: Mapping[str, str] | None = None,
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        frame_pointers: bool = True,
    ) -> SparkSubmitProcess:
        """spark-submit ``app`` (a .py or a .jar) in client mode; stdout/stderr go to files in the log dir.

        Defaults: 1 core and 512m per executor, at most ``worker_cores`` cores, frame pointers on in the
        driver and the executors; ``conf`` overrides any of them.
        """
        if self._master is None:
            raise SparkClusterError("LocalSparkCluster: not started; call start() first")
        self._app_counter += 1
        stem = name or Path(app).stem
        tag = f"app{self._app_counter}-{re.sub(r'[^A-Za-z0-9_.-]', '_', stem)}"
        merged: dict[str, str] = {
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": str(self.worker_cores * max(1, len(self.worker_hosts))),
            "spark.driver.memory": "512m",
            "spark.driver.host": self.bind_address,
            "spark.driver.bindAddress": self.bind_address,
            "spark.ui.enabled": "false",
            "spark.ui.showConsoleProgress": "false",
            "spark.sql.shuffle.partitions": "2",
            "spark.executor.extraJavaOptions": DEFAULT_JAVA_OPTIONS if frame_pointers else "",
            "spark.driver.extraJavaOptions": DEFAULT_JAVA_OPTIONS if frame_pointers else "",
            "spark.local.dir": str(self.tmp_dir / "local"),
        }
        merged.update(conf or {})
        argv = [str(self.spark_home / "bin" / "spark-submit"), "--master", self.master_url, "--name", stem]
        for key, value in merged.items():
            argv += ["--conf", f"{key}={value}"]
        # spark-submit runs in the log directory: a relative app path must not change meaning.
        argv.append(str(Path(app).resolve()))
        argv += list(args)
        stdout_path = self.tmp_dir / f"{tag}.out"
        stderr_path = self.tmp_dir / f"{tag}.err"
        run_env = dict(self._env)
        run_env.update(env or {})
        with open(stdout_path, "wb") as out, open(stderr_path, "wb") as err:
            process = SparkSubmitProcess(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                env=run_env,
                cwd=self.tmp_dir,
                preexec_fn=die_with_parent,
            )
        process.stdout_path = stdout_path
        process.stderr_path = stderr_path
        self.apps.append(process)
        return process

    def stop_app(self, app: SparkSubmitProcess, grace: float = _STOP_GRACE_S) -> int | None:
        """Terminate a submitted app (driver JVM and its Python) and wait for its executors to go."""
        terminate_group(app, grace)
        deadline = time.monotonic() + 30
        while self.executor_pids() and not self._other_apps_running(app) and time.monotonic() < deadline:
            time.sleep(0.2)
        return app.returncode

    def _other_apps_running(self, app: SparkSubmitProcess) -> bool:
        return any(other is not app and other.poll() is None for other in self.apps)

    # --- processes -------------------------------------------------------------------------------

    def daemon_pids(self) -> list[int]:
        pids = [self._master.pid] if self._master is not None else []
        return pids + [w.process.pid for w in self.workers]

    def executor_pids(self) -> list[int]:
        """PIDs of the executor JVMs (CoarseGrainedExecutorBackend) our Workers started, sorted."""
        found: list[int] = []
        for worker in self.workers:
            try:
                children = psutil.Process(worker.process.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                continue
            for child in children:
                try:
                    if EXECUTOR_MAIN_CLASS in child.cmdline() and child.status() != psutil.STATUS_ZOMBIE:
                        found.append(child.pid)
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
        return sorted(found)

    def driver_pids(self, app: SparkSubmitProcess | None) -> list[int]:
        """The driver JVM (SparkSubmit) of a submitted app: the process itself or one of its children."""
        if app is None:
            return []
        try:
            root = psutil.Process(app.pid)
            candidates = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []
        found = []
        for proc in candidates:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if "org.apache.spark.deploy.SparkSubmit" in proc.cmdline():
                    found.append(proc.pid)
        return found

    def wait_for_executors(self, count: int = 1, timeout: float = 120.0) -> list[int]:
        return poll_until(
            lambda: pids if len(pids := self.executor_pids()) >= count else None,
            timeout,
            lambda: SparkClusterError(
                f"{self.tmp_dir}: {len(self.executor_pids())} of {count} executors running after {timeout:.0f} s; "
                "read the app logs"
            ),
        )

    def all_pids(self) -> list[int]:
        """Every live process this cluster started (daemons, apps and all their descendants)."""
        roots = self.daemon_pids() + [a.pid for a in self.apps]
        return live_process_tree(roots)

    def stop(self) -> None:
        """Kill apps, then Workers (their executors), then the Master; wait for every one. Idempotent."""
        master = [self._master] if self._master is not None else []
        groups = [*self.apps, *(w.process for w in reversed(self.workers)), *master]
        stop_all(groups, self.all_pids(), _STOP_GRACE_S)
        # Forget them: a second stop() must not signal process groups whose ids may have been reused.
        self._master = None
        self.apps.clear()
        self.workers.clear()
        self.release_scratch(bool(os.environ.get("SPARK_LOCAL_KEEP_LOGS")))
