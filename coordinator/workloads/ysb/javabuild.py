"""Compile Java source files against a directory of jars into a jar, cached by content."""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path

from coordinator.workloads.sparkcluster import java_home
from profiler.errors import CapabilityError

# The Redis client of the YSB sinks, compiled into both the Spark sink's jar and the Flink job's jar.
RESP_SOURCE = Path(__file__).resolve().parent / "RespConnection.java"


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "spe-taskprof"


def compile_jar(
    sources: Sequence[Path], classpath: str, name: str, key_parts: Sequence[str], cache: Path | None = None
) -> Path:
    """``<cache>/<name>-<key>.jar`` built from ``sources`` with javac; the key hashes the sources and
    ``key_parts`` (the names of the jars compiled against), so a new engine version rebuilds it."""
    content = b"".join(source.read_bytes() for source in sources)
    key = hashlib.sha256(content + "\n".join(key_parts).encode()).hexdigest()[:16]
    cache = cache or cache_dir()
    jar = cache / f"{name}-{key}.jar"
    if jar.exists():
        return jar
    javac = java_home() / "bin" / "javac"
    if not javac.exists():
        raise CapabilityError(f"{javac}: no javac; install a JDK (openjdk-17-jdk-headless), not only a JRE")
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as build:
        result = subprocess.run(
            [str(javac), "-nowarn", "-encoding", "UTF-8", "-d", build, "-cp", classpath, *map(str, sources)],
            capture_output=True, text=True, timeout=300,
        )
        if result.returncode != 0:
            raise CapabilityError(f"{sources[0]}: javac failed: {result.stderr.strip().splitlines()[-1:]}")
        partial = jar.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for path in sorted(Path(build).rglob("*.class")):
                archive.write(path, path.relative_to(build).as_posix())
        partial.replace(jar)  # atomic: concurrent builders never see half a jar
    return jar
