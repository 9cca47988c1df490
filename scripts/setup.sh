#!/usr/bin/env bash
# One set-up step for a fresh machine (Debian 12, root): system packages, kernel headers for bcc,
# a virtual environment with the package, Debian's bcc module made importable in it, the JVMTI agent.
# Idempotent: a second run installs nothing and takes a few seconds.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}

say() { printf 'setup: %s\n' "$*"; }

if [ "$(id -u)" -ne 0 ]; then
  say "needs root (apt-get, kernel headers link); run: sudo $0" >&2
  exit 3
fi

# Debian packages the profiler, its tests, the demo and the report tests use (golang-go: `go tool
# pprof` reads the pprof exports in tests/integration/test_exports_tools.py).
PKGS=(bpfcc-tools python3-bpfcc python3-psutil linux-perf bpftool openjdk-17-jdk-headless
      build-essential linux-headers-amd64 openssh-server iproute2 procps chromium redis-server golang-go
      sudo libfaketime maven gdb)  # gdb: the CPython layout's check against its DWARF; the fault tests: a non-root SSH user with sudo -n, a host clock 30 s ahead
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing Debian packages: ${missing[*]}"
  apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
fi
# Debian starts services on install; tests start their own sshd and redis on other ports.
systemctl disable --now ssh redis-server >/dev/null 2>&1 || true

# bcc compiles against the running kernel's headers; when none ship, use Debian's nearest ones.
KVER=$(uname -r)
if [ ! -e "/lib/modules/$KVER/build/include" ]; then
  hdr=$(ls -d /usr/src/linux-headers-*-amd64 2>/dev/null | sort -V | tail -n 1 || true)
  common=$(ls -d /usr/src/linux-headers-*-common 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$hdr" ] || [ -z "$common" ]; then
    say "no kernel headers found under /usr/src; install linux-headers-amd64" >&2
    exit 4
  fi
  mkdir -p "/lib/modules/$KVER"
  ln -sfn "$hdr" "/lib/modules/$KVER/build"
  ln -sfn "$common" "/lib/modules/$KVER/source"
  say "kernel $KVER has no headers: linked $(basename "$hdr") (headers from another kernel version; BTF covers the difference)"
fi

if [ ! -x "$VENV/bin/python" ]; then
  say "creating virtual environment $VENV"
  "$PYTHON" -m venv "$VENV"
fi
stamp="$VENV/.installed-$(cat setup.py profiler/__init__.py | md5sum | cut -c1-12)"
if [ ! -e "$stamp" ]; then
  say "installing the package and its dependencies into $VENV"
  "$VENV/bin/pip" install -q --upgrade pip >/dev/null
  "$VENV/bin/pip" install -q -e '.[coordinator,dev]'
  touch "$stamp"
fi

# Debian's bcc is pure Python over libbcc; expose only that package, not all of dist-packages.
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$VENV/debian-bcc"
ln -sfn /usr/lib/python3/dist-packages/bcc "$VENV/debian-bcc/bcc"
echo "$(cd "$VENV/debian-bcc" && pwd)" > "$site/debian_bcc.pth"
"$VENV/bin/python" -c 'import bcc' || { say "bcc does not import in $VENV" >&2; exit 4; }

# Flink for `coordinator demo --spe flink`: PyPI's apache-flink distribution, kept out of the venv
# (it pins pandas<2.3 and pyarrow<21) under ~/.cache/spe-taskprof; a second run finds it there.
"$VENV/bin/python" -c 'from coordinator.workloads.flinkcluster import flink_home; flink_home(say=lambda m: print("setup:", m))'

# Kafka for `coordinator demo --source kafka`: the broker's jars, Flink's Kafka connector and Spark's of the
# installed pyspark's version, from Maven Central with mvn, cached under ~/.cache/spe-taskprof.
"$VENV/bin/python" -c 'from coordinator.workloads.kafka import flink_kafka_jars, kafka_lib, spark_kafka_jars; say = lambda m: print("setup:", m); kafka_lib(say=say); spark_kafka_jars(say=say); flink_kafka_jars(say=say)'

# `go tool pprof` (test_exports_tools): Go 1.24 and later build it from source on first use (about 30 s
# here); built once into the cache the test uses, a second run finds it there.
GOCACHE="$HOME/.cache/spe-taskprof/go-build" go tool pprof -h >/dev/null 2>&1 || true

# The JVMTI perf-map agent for JDKs without Compiler.perfmap.
if [ -f profiler/symbols/agent/Makefile ]; then
  make -s -C profiler/symbols/agent >/dev/null
fi
say "ready ($VENV)"
