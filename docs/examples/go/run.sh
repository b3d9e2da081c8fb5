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

. "$here/../../http-server.sh"
data="$(mktemp -d)"
server_pid=""
trap '[ -z "$server_pid" ] || { kill "$server_pid" 2>/dev/null; wait "$server_pid" 2>/dev/null; }; rm -rf "$data"' EXIT
start_http_server "$server_bin" "$data"
"${TMPDIR:-/tmp}/prefixscorer" -demo -server "$server_url" -ca "$data/cert.pem"
