#!/usr/bin/env bash
# SGLang's KV indexer service (server/proto/kv_indexer.proto) against a real
# prefix-server, as SGLang's router and bridge call it (CI runs this from
# .ci/run): a client generated from the proto by pinned grpcio-tools, the
# proto's descriptor held to the one of SGLang's own file at the pinned
# commit, and SGLang's contract scenarios run (check.py).
# Usage: check.sh [prefix-server binary]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto_dir="$(realpath "$here/../../server/proto")"
server_bin="$(realpath "${1:-$here/../../target/release/prefix-server}")"

. "$here/../../docs/http-server.sh"
make_work_dir

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check \
  grpcio==1.85.3 grpcio-tools==1.85.1 pyzmq==27.3.0 msgpack==1.2.4
"$work/venv/bin/python" -m grpc_tools.protoc -I"$proto_dir" \
  --python_out="$work" --grpc_python_out="$work" \
  --descriptor_set_out="$work/kv_indexer.pb" "$proto_dir/kv_indexer.proto"

data="$work/data"
mkdir "$data"
# Plain HTTP/2, as the router and the bridge speak; the engine's own hashes
# as block aliases, for the scenario of a pod followed through its events.
start_http_server "$server_bin" "$data" --http-plaintext --block-aliases engine
addr="${server_url##*://}"

PYTHONPATH="$work" "$work/venv/bin/python" "$here/check.py" "$addr" "$work/kv_indexer.pb" ||
  { echo "--- server log"; cat "$data/server.log"; exit 1; }
