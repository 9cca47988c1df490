#!/usr/bin/env bash
# How templates/vendor/ was obtained: `npm pack` of pinned d3 and d3-flame-graph, dist files copied.
# Re-run only to change the pinned versions (then update docs/report.md); the files are committed,
# so building, testing and viewing a report never needs the network.
set -euo pipefail
cd "$(dirname "$0")/.."
D3_VERSION=${D3_VERSION:-7.9.0}
FLAME_VERSION=${FLAME_VERSION:-4.1.3}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
(cd "$work" && npm pack --silent "d3@$D3_VERSION" "d3-flame-graph@$FLAME_VERSION" >/dev/null)
mkdir -p "$work/d3" "$work/flame" templates/vendor
tar xzf "$work/d3-$D3_VERSION.tgz" -C "$work/d3"
tar xzf "$work/d3-flame-graph-$FLAME_VERSION.tgz" -C "$work/flame"
cp "$work/d3/package/dist/d3.min.js" templates/vendor/d3.min.js
cp "$work/d3/package/LICENSE" templates/vendor/d3.LICENSE
cp "$work/flame/package/dist/d3-flamegraph.min.js" templates/vendor/d3-flamegraph.min.js
cp "$work/flame/package/dist/d3-flamegraph.css" templates/vendor/d3-flamegraph.css
cp "$work/flame/package/LICENSE" templates/vendor/d3-flamegraph.LICENSE
printf 'd3 %s ISC\nd3-flame-graph %s Apache-2.0\n' "$D3_VERSION" "$FLAME_VERSION" > templates/vendor/VERSIONS
(cd templates/vendor && sha256sum d3.min.js d3-flamegraph.min.js d3-flamegraph.css > SHA256SUMS)
echo "vendor-js: templates/vendor/ now holds d3 $D3_VERSION and d3-flame-graph $FLAME_VERSION"
