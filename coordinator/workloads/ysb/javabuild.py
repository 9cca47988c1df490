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
    sources: Sequence[Path], classpath: str, name: str, key_parts: Sequence[str], cache: Path | None = None,
    bundle: Sequence[Path] = (),
) -> Path:
    """``<cache>/<name>-<key>.jar`` built from ``sources`` with javac; the key hashes the sources and
    ``key_parts`` (the names of the jars compiled against), so a new engine version rebuilds it. The
    classes of the ``bundle`` jars go into it too (an uber jar: what a job submitted to a running
    cluster brings of its own), and onto the classpath javac sees."""
    content = b"".join(source.read_bytes() for source in sources)
    key_parts = [*key_parts, *(jar.name for jar in bundle)]
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
            [str(javac), "-nowarn", "-encoding", "UTF-8", "-d", build, "-cp",
             os.pathsep.join([classpath, *map(str, bundle)]), *map(str, sources)],
            capture_output=True, text=True, timeout=300,
        )
        if result.returncode != 0:
            raise CapabilityError(f"{sources[0]}: javac failed: {result.stderr.strip().splitlines()[-1:]}")
        partial = jar.with_suffix(f".{os.getpid()}.tmp")
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            archive.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\r\n\r\n")
            for path in sorted(Path(build).rglob("*.class")):
                archive.write(path, path.relative_to(build).as_posix())
            bundle_jars(archive, bundle)
        partial.replace(jar)  # atomic: concurrent builders never see half a jar
    return jar


def _bundled(name: str) -> bool:
    """Whether an entry of a bundled jar goes into the uber jar: not its manifest, signatures or
    module descriptors (they describe the jar they came from), not directories."""
    upper = name.upper()
    return not (
        name.endswith("/") or upper == "META-INF/MANIFEST.MF" or upper.endswith((".SF", ".RSA", ".DSA", ".EC"))
        or name.endswith("module-info.class")
    )


def bundle_jars(archive: zipfile.ZipFile, jars: Sequence[Path]) -> None:
    """Copy the entries of ``jars`` into ``archive``: the first jar's copy of a class wins; service
    files (META-INF/services/...) are concatenated, so every jar's providers stay registered."""
    written = set(archive.namelist())
    services: dict[str, list[bytes]] = {}
    for path in jars:
        with zipfile.ZipFile(path) as source:
            for entry in source.infolist():
                if not _bundled(entry.filename):
                    continue
                if entry.filename.startswith("META-INF/services/"):
                    services.setdefault(entry.filename, []).append(source.read(entry).rstrip(b"\n") + b"\n")
                elif entry.filename not in written:
                    written.add(entry.filename)
                    archive.writestr(entry, source.read(entry))
    for name, parts in sorted(services.items()):
        archive.writestr(name, b"".join(parts))
