#!/usr/bin/env bash
# Writes server/link/startup-symbols.txt: the functions of prefix-server
# that run from its start to its rest, in its first requests and for its
# first engine, which the linker places first in the binary
# (server/build.rs, lld's --symbol-ordering-file). A server then maps
# those pages of its code rather than pages spread over all of it
# (docs/benchmarks.md, "Idle memory").
#
#   server/link/startup-symbols.sh BINARY...
#
# Each BINARY is run under valgrind's callgrind with the flags of the
# end-to-end bench, in three phases dumped apart (callgrind_control): its
# start and rest; a health probe, an engine's registration and lookups over
# HTTP (curl); a live engine's events over its subscription (`prefix-load
# events`, which subscribes it and looks up over QUIC) and its stop. The
# file lists the functions each phase ran that no earlier phase ran, phase
# after phase, each the union over the binaries as named in them, so that
# a server at rest maps the start's stretch of code and its first engine
# the next. PREFIX_LOAD names the prefix-load binary (default:
# target/release/prefix-load); any build of it will do.
# Give it each build that ships, since a crate's features, unified over
# the packages a build takes, are in its names:
#   cargo build --profile ci -p prefix-server            (the benches')
#   cargo build --release -p prefix-server               (cargo install's)
#   cargo build --release --bin prefix-server --bin prefix-client  (the image's)
# copying each binary aside before the next build replaces it. Run it again
# when the toolchain or the dependencies change, since names carry their
# crate's hash: a name that no longer matches is passed over, and the code
# it named is placed as if unlisted.
set -euo pipefail
export LC_ALL=C
here=$(cd "$(dirname "$0")" && pwd)
out=$here/startup-symbols.txt
[ $# -gt 0 ] || { echo "usage: $0 BINARY..." >&2; exit 2; }
command -v callgrind_control >/dev/null || { echo "$0: needs valgrind" >&2; exit 1; }
load=${PREFIX_LOAD:-$here/../../target/release/prefix-load}
[ -x "$load" ] || { echo "$0: no prefix-load at $load (set PREFIX_LOAD)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A short trace in the Mooncake format for the engine: 48 requests of four
# blocks sharing the first, in caches of 64 blocks, so that it stores,
# evicts and hits.
for i in $(seq 0 47); do
  echo "{\"timestamp\": $i, \"input_length\": 256, \"output_length\": 16, \"hash_ids\": [0, $((i * 3 + 1)), $((i * 3 + 2)), $((i * 3 + 3))]}"
done >"$work/trace.jsonl"
# ran DUMP BINARY PHASE: appends to `ran.PHASE` the functions of BINARY
# that callgrind's DUMP shows run. callgrind names each object and function
# once a file, as `ob=(N) name` or `fn=(N) name` (also as cob=/cfn= in a
# call), then by number alone.
ran() {
  awk -v bin="$2" '
    /^c?(ob|fn)=\([0-9]+\)/ {
      called = substr($0, 1, 1) == "c"
      kind = substr($0, called ? 2 : 1, 2)
      id = substr($0, index($0, "(") + 1)
      id = substr(id, 1, index(id, ")") - 1)
      rest = substr($0, index($0, ")") + 2)
      if (rest != "") name[kind, id] = rest
      if (called) next
      if (kind == "ob") here = (name["ob", id] == bin)
      else if (here) print name["fn", id]
    }' "$1" | sed "s/'[0-9]*$//" >>"$work/ran.$3"
}
for bin in "$@"; do
  bin=$(readlink -f "$bin")
  # A fresh data directory each time, so that each start makes its
  # certificate as a first start does.
  rm -rf "$work"/cg* "$work/data"
  valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/cg" \
    "$bin" --listen 127.0.0.1:0 --metrics-listen off --http-listen 127.0.0.1:0 \
    --http-plaintext --token-block 16 --snapshot-interval 0s \
    --data-dir "$work/data" >"$work/log" 2>&1 &
  pid=$!
  http= quic=
  for _ in $(seq 1 120); do
    http=$(sed -n 's/.*serving the HTTP\/JSON API http=\([0-9.:]*\).*/\1/p' "$work/log")
    quic=$(sed -n 's/.*serving listen=\([0-9.:]*\).*/\1/p' "$work/log")
    [ -n "$http" ] && [ -n "$quic" ] && break
    sleep 0.5
  done
  [ -n "$http" ] && [ -n "$quic" ] || { echo "$0: $bin did not start" >&2; cat "$work/log" >&2; exit 1; }
  # Phase 1: the start and a rest well past the 3 s at which the bench
  # reads its memory, under valgrind's slowdown.
  sleep 10
  callgrind_control -d start "$pid" >/dev/null 2>&1
  # Phase 2: what a server does first besides starting: a health probe, an
  # engine registered (at an address where none listens), lookups over
  # HTTP.
  tokens=$(seq -s, 1 32)
  ask() { curl -s -o /dev/null -H 'content-type: application/json' -d "$2" "http://$http$1"; }
  curl -s -o /dev/null "http://$http/health"
  ask /register '{"instance_id":1,"endpoint":"tcp://127.0.0.1:9","model_name":"m","block_size":16,"dp_rank":0}'
  ask /query "{\"token_ids\":[$tokens],\"model_name\":\"m\"}"
  ask /v1/lookup "{\"model\":\"m\",\"tokens\":[$tokens]}"
  ask /v1/stats '{}'
  sleep 2
  callgrind_control -d requests "$pid" >/dev/null 2>&1
  # Phase 3: a live engine. Its subscription connects, applies stores and
  # evictions, and is looked up and unsubscribed over QUIC; then the stop.
  "$load" events --server "$quic" --ca "$work/data/cert.pem" \
    --trace "$work/trace.jsonl" --engines 1 --rounds 1 --capacity 64 \
    --timeout 120s >"$work/events" 2>&1 ||
    { echo "$0: prefix-load events failed" >&2; cat "$work/events" >&2; exit 1; }
  sleep 2
  kill -INT "$pid"
  wait "$pid" || true
  ran "$work/cg.1" "$bin" 1
  ran "$work/cg.2" "$bin" 2
  ran "$work/cg" "$bin" 3
  # Only names the binary defines as functions.
  nm --defined-only "$bin" | awk '$2 ~ /^[tT]$/ { print $3 }' >>"$work/defined"
done
# Each phase's names after the earlier phases', so that a server at rest
# maps the start's code alone and its first engine the next stretch.
sort -u "$work/defined" >"$work/defined.sorted"
: >"$work/seen"
: >"$out"
for phase in 1 2 3; do
  sort -u "$work/ran.$phase" | comm -12 - "$work/defined.sorted" |
    comm -23 - "$work/seen" >"$work/new"
  cat "$work/new" >>"$out"
  sort -u "$work/seen" "$work/new" -o "$work/seen"
done
echo "$out: $(wc -l <"$out") symbols" >&2
