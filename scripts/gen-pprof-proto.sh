#!/usr/bin/env bash
# Regenerate coordinator/export/profile_pb2.py(i) from the vendored pprof profile.proto (google/pprof,
# proto/profile.proto, Apache-2.0: coordinator/export/profile.proto.LICENSE). Only re-run to change the
# proto or the protobuf version: protoc comes from grpcio-tools in a throw-away virtual environment,
# and the generated code needs a protobuf runtime at least as new as the one it names (setup.py).
set -euo pipefail
cd "$(dirname "$0")/.."
GRPCIO_TOOLS=${GRPCIO_TOOLS:-1.85.1}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m venv "$tmp/venv"
"$tmp/venv/bin/pip" install -q "grpcio-tools==$GRPCIO_TOOLS"
# The path from the tree's root is the name the proto registers in protobuf's default descriptor
# pool: unique, so another library's profile.proto cannot clash with it.
"$tmp/venv/bin/python" -m grpc_tools.protoc -I. --python_out=. --pyi_out=. coordinator/export/profile.proto
grep -m1 'Protobuf Python Version' coordinator/export/profile_pb2.py
