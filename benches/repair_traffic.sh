#!/usr/bin/env bash
# Repair's traffic: loopback bytes a second over 20 s between two idle
# replicas, each the other's peer, both given the same 2,000 keys of
# BLOCKS blocks over 8 pods (docs/benchmarks.md, "Replicas that converge"),
# once they are alike.
# Needs `cargo build --release` (or the binaries' directory in BIN), an
# otherwise idle loopback, and curl.
# usage: benches/repair_traffic.sh BLOCKS REPAIR_BUDGET [server flags...]
set -eu
cd "$(dirname "$0")/.."
bin=${BIN:-target/release}
blocks=$1 budget=$2
shift 2
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait; rm -rf "$dir"' EXIT
mkdir "$dir/a" "$dir/b"
serve() { # name port peer-port [flags...]
  local name=$1 port=$2 peer=$3
  shift 3
  $bin/prefix-server --listen 127.0.0.1:$port --metrics-listen 127.0.0.1:$((port + 1)) \
    --data-dir "$dir/$name" --snapshot-interval 0s --peer 127.0.0.1:$peer \
    --repair-budget "$budget" "$@" >"$dir/$name.log" 2>&1 &
}
ready() { until curl -sf -o /dev/null "localhost:$1/readyz"; do sleep 0.1; done; }
serve a 27070 27080 "$@"
until [ -f "$dir/a/key.pem" ]; do sleep 0.1; done
serve b 27080 27070 --cert "$dir/a/cert.pem" --key "$dir/a/key.pem" "$@"
ready 27071
ready 27081
python3 - "$blocks" >"$dir/ops.jsonl" <<'PY'
import random, sys
blocks = int(sys.argv[1])
random.seed(1)
for i in range(2000):
    key = [random.getrandbits(64) for _ in range(blocks)]
    print('{"op":"insert","model":"m%d","hashes":%s,"pod":"p%d"}' % (i % 4, key, i % 8))
PY
# Both servers are given the keys, seconds apart (so their entries' times
# differ by that much); with FEED=one, only the first is, and the second
# takes them from it by repair (at the first's times, as a replica set's
# writes are within milliseconds), before the measure begins.
ports="27070 27080"
[ "${FEED:-both}" = one ] && ports=27070
for port in $ports; do
  $bin/prefix-client --server 127.0.0.1:$port --ca "$dir/a/cert.pem" replay "$dir/ops.jsonl" >/dev/null
done
sleep 10
lo() { awk '/lo:/ { print $2 }' /proc/net/dev; }
copied() {
  curl -s localhost:27071/metrics localhost:27081/metrics |
    awk '/^prefix_index_repair_copied_entries_total/ { n += $2 } END { print n + 0 }'
}
before=$(lo) copied_before=$(copied)
sleep 20
after=$(lo) copied_after=$(copied)
echo "blocks=$blocks repair-budget=$budget: $(( (after - before) / 20 )) B/s on loopback," \
  "$((copied_after - copied_before)) entries copied in the 20 s"
