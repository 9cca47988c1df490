"""Finding an engine's REST API in a profiled process: which processes serve one (a Spark driver's UI, a Flink
JobManager's REST API) and which of their listening ports answers, at most MAX_PORTS_PROBED of them tried."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ..capture.format import ProcessInfo
from .rest import EndpointError, Fetch, Probe, speaks_http

# Kinds (known_spes.txt) whose process serves the engine's REST API.
SPARK_UI_KINDS = frozenset(
    {"driver", "local-driver", "connect-server", "local-connect-server", "thrift-server", "application-master"}
)
FLINK_REST_KINDS = frozenset({"jobmanager"})
SPARK_DRIVER_CLASSES = ("org.apache.spark.deploy.SparkSubmit", "org.apache.spark.deploy.yarn.ApplicationMaster")
FLINK_JOBMANAGER_MARKERS = ("ClusterEntrypoint", "ClusterEntryPoint", "org.apache.flink.runtime.minicluster")

SPARK_DEFAULT_UI_PORTS = range(4040, 4140)
FLINK_DEFAULT_REST_PORT = 8081
# Each request has its own total deadline (rest.py); this bounds how many a hostile process can cost.
MAX_PORTS_PROBED = 32  # listening ports of one process tried as its REST API


def _listening_endpoints(pid: int) -> list[tuple[str, int]]:
    import psutil

    try:
        connections = psutil.Process(pid).net_connections(kind="tcp")
    except (psutil.Error, OSError):
        return []
    found: list[tuple[str, int]] = []
    for conn in connections:
        if conn.status != psutil.CONN_LISTEN or not conn.laddr:
            continue
        host = conn.laddr.ip
        if host in ("0.0.0.0", "::", "::ffff:0.0.0.0"):
            host = "127.0.0.1"
        elif host.startswith("::ffff:"):
            host = host[len("::ffff:"):]
        found.append((host, conn.laddr.port))
    return sorted(set(found))


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def _cmdline_setting(cmdline: str, key: str) -> str | None:
    match = re.search(re.escape(key) + r"=(\S+)", cmdline)
    return match.group(1) if match else None


def engine_of(process: ProcessInfo) -> str | None:
    """"spark" or "flink" when the process serves the engine's REST API, else None."""
    if process.engine == "spark" and process.kind in SPARK_UI_KINDS:
        return "spark"
    if process.engine == "flink" and process.kind in FLINK_REST_KINDS:
        return "flink"
    if any(marker in process.cmdline for marker in SPARK_DRIVER_CLASSES):
        return "spark"
    if "org.apache.flink" in process.cmdline and any(m in process.cmdline for m in FLINK_JOBMANAGER_MARKERS):
        return "flink"
    return None


def _ordered_ports(endpoints: list[tuple[str, int]], preferred: Sequence[int]) -> list[tuple[str, int]]:
    rank = {port: index for index, port in enumerate(preferred)}
    return sorted(endpoints, key=lambda e: (rank.get(e[1], len(rank)), e[1]))


def _first_answer(
    process: ProcessInfo, preferred: Sequence[int], path: str, fetch: Fetch, accept: Callable[[Any], str | None],
    probe: Probe = speaks_http, errors: list[str] | None = None,
) -> tuple[str, str] | None:
    """(base URL, what ``accept`` read) of the first listening port of ``process`` (``preferred`` ones
    first) that speaks HTTP and answers ``path`` with something ``accept`` takes; why the ports that speak
    HTTP did not answer goes to ``errors``."""
    for host, port in _ordered_ports(_listening_endpoints(process.pid), preferred)[:MAX_PORTS_PROBED]:
        if not probe(host, port):
            continue
        base = _url(host, port)
        try:
            found = accept(fetch(f"{base}{path}"))
        except EndpointError as exc:
            if errors is not None:
                errors.append(str(exc))
            continue
        if found is not None:
            return base, found
    return None


def discover_spark(
    process: ProcessInfo, fetch: Fetch, probe: Probe = speaks_http, errors: list[str] | None = None
) -> tuple[str, str] | None:
    """(UI base URL, application id) of a Spark driver: its listening ports, UI ports first (``errors``:
    _first_answer's)."""
    preferred: list[int] = []
    configured = _cmdline_setting(process.cmdline, "spark.ui.port")
    if configured and configured.isdigit():
        preferred.append(int(configured))
    preferred += list(SPARK_DEFAULT_UI_PORTS)

    def application_id(apps: Any) -> str | None:
        if isinstance(apps, list) and apps and isinstance(apps[0], Mapping) and "id" in apps[0]:
            return str(apps[0]["id"])
        return None

    return _first_answer(process, preferred, "/api/v1/applications", fetch, application_id, probe, errors)


def discover_flink(
    process: ProcessInfo, fetch: Fetch, probe: Probe = speaks_http, errors: list[str] | None = None
) -> str | None:
    """Base URL of a Flink JobManager's REST API (answers /config with a flink-version)."""
    preferred = [FLINK_DEFAULT_REST_PORT]
    configured = _cmdline_setting(process.cmdline, "rest.port")
    if configured and configured.isdigit():
        preferred.insert(0, int(configured))

    def version(config: Any) -> str | None:
        return str(config["flink-version"]) if isinstance(config, Mapping) and "flink-version" in config else None

    found = _first_answer(process, preferred, "/config", fetch, version, probe, errors)
    return found[0] if found is not None else None
