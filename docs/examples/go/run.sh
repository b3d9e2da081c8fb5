#!/usr/bin/env bash
# Builds and tests the Go example, then runs its demo against a real
# prefix-server (CI runs this from .ci/run). Usage: run.sh [prefix-server binary]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
server_bin="$(realpath "${1:-$here/../../../target/release/prefix-server}")"
cd "$here"
go vet ./...
go test ./...
go build -o "${TMPDIR:-/tmp}/prefixscorer" .

data="$(mktemp -d)"
log="$data/server.log"
"$server_bin" --data-dir "$data" --listen 127.0.0.1:0 --metrics-listen off \
  --http-listen 127.0.0.1:0 --snapshot-interval 0s >"$log" 2>&1 &
pid=$!
trap 'kill "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; rm -rf "$data"' EXIT
# The server logs the API's bound address once it listens.
addr=""
for _ in $(seq 1 200); do
  addr="$(sed -n 's/.*serving the HTTP\/JSON API http=\([0-9.:]*\).*/\1/p' "$log" | head -n 1)"
  [ -n "$addr" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$log"; exit 1; }
  sleep 0.05
done
[ -n "$addr" ] || { echo "the server never listened"; cat "$log"; exit 1; }
"${TMPDIR:-/tmp}/prefixscorer" -demo -server "https://localhost:${addr##*:}" -ca "$data/cert.pem"
