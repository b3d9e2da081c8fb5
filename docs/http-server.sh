# Sourced by the scripts that run a client against a real prefix-server's
# HTTP/JSON API (examples/go/run.sh, openapi/check.sh,
# conformance/sglang/check.sh).
#
# make_work_dir makes a temporary directory, `work`, and has the script's
# exit stop the server start_http_server started (if it did) and remove
# the directory.
make_work_dir() {
  work="$(mktemp -d)"
  server_pid=""
  trap stop_and_clean_up EXIT
}

stop_and_clean_up() {
  if [ -n "$server_pid" ]; then
    kill "$server_pid" 2>/dev/null || true
    wait "$server_pid" 2>/dev/null || true
  fi
  rm -rf "$work"
}
#
# start_http_server BINARY DATA_DIR [FLAGS...] starts BINARY on loopback
# ports it picks itself, with its data (and self-signed cert.pem) in
# DATA_DIR and its log in DATA_DIR/server.log, and returns once the API
# listens: `server_pid` is its process, `server_url` the API's base URL
# (the certificate names localhost). The caller stops it.
start_http_server() {
  local bin="$1" data="$2"
  shift 2
  local log="$data/server.log" addr=""
  "$bin" --data-dir "$data" --listen 127.0.0.1:0 --metrics-listen off \
    --http-listen 127.0.0.1:0 --snapshot-interval 0s "$@" >"$log" 2>&1 &
  server_pid=$!
  # The server logs the API's bound address once it listens.
  for _ in $(seq 1 200); do
    addr="$(sed -n 's/.*serving the HTTP\/JSON API http=\([0-9.:]*\).*/\1/p' "$log" | head -n 1)"
    [ -n "$addr" ] && break
    kill -0 "$server_pid" 2>/dev/null || { cat "$log"; return 1; }
    sleep 0.05
  done
  [ -n "$addr" ] || { echo "the server never listened"; cat "$log"; return 1; }
  server_url="https://localhost:${addr##*:}"
}
