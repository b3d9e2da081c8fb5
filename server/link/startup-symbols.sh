#!/usr/bin/env bash
# Writes server/link/startup-symbols.txt: the functions of prefix-server that
# run from its start to its rest and in its first requests, which the
# linker places first in the binary (server/build.rs, lld's
# --symbol-ordering-file). A server then maps those pages of its code
# rather than pages spread over all of it (docs/benchmarks.md, "Idle
# memory").
#
#   server/link/startup-symbols.sh BINARY...
#
# Each BINARY is run under valgrind's callgrind with the
# flags of the end-to-end bench, asked a health probe, an engine's
# registration and lookups over HTTP (curl), left to rest, then stopped;
# the file is the union of the symbols each ran, as named in that binary.
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
command -v valgrind >/dev/null || { echo "$0: needs valgrind" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for bin in "$@"; do
  bin=$(readlink -f "$bin")
  valgrind --tool=callgrind --demangle=no --callgrind-out-file="$work/cg" \
    "$bin" --listen 127.0.0.1:0 --metrics-listen off --http-listen 127.0.0.1:0 \
    --http-plaintext --token-block 16 --snapshot-interval 0s \
    --data-dir "$work/data" >"$work/log" 2>&1 &
  pid=$!
  http=
  for _ in $(seq 1 120); do
    http=$(sed -n 's/.*serving the HTTP\/JSON API http=\([0-9.:]*\).*/\1/p' "$work/log")
    [ -n "$http" ] && break
    sleep 0.5
  done
  [ -n "$http" ] || { echo "$0: $bin did not start" >&2; cat "$work/log" >&2; exit 1; }
  # What a server does first besides starting: a health probe, an engine
  # registered (at an address where none listens), lookups over HTTP. So
  # the code these run lies with the start's, not where it would map 64 KiB
  # around each function at its first use.
  tokens=$(seq -s, 1 32)
  ask() { curl -s -o /dev/null -H 'content-type: application/json' -d "$2" "http://$http$1"; }
  curl -s -o /dev/null "http://$http/health"
  ask /register '{"instance_id":1,"endpoint":"tcp://127.0.0.1:9","model_name":"m","block_size":16,"dp_rank":0}'
  ask /query "{\"token_ids\":[$tokens],\"model_name\":\"m\"}"
  ask /v1/lookup "{\"model\":\"m\",\"tokens\":[$tokens]}"
  ask /v1/stats '{}'
  # At rest well past the 3 s at which the bench reads its memory, under
  # valgrind's slowdown.
  sleep 10
  kill -INT "$pid"
  wait "$pid" || true
  # callgrind names each object and function once, as `ob=(N) name` or
  # `fn=(N) name` (also as cob=/cfn= in a call), then by number alone.
  awk -v bin="$bin" '
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
    }' "$work/cg" | sed "s/'[0-9]*$//" >>"$work/ran"
  # Only names the binary defines as functions.
  nm --defined-only "$bin" | awk '$2 ~ /^[tT]$/ { print $3 }' >>"$work/defined"
done
sort -u "$work/defined" >"$work/defined.sorted"
sort -u "$work/ran" | comm -12 - "$work/defined.sorted" >"$out"
echo "$out: $(wc -l <"$out") symbols" >&2
