#!/usr/bin/env bash
# CI: builds the image (deploy/image/build.sh) and proves it runs. The
# server started from it must answer /healthz, an insert and a lookup over
# QUIC (the host's prefix-client) and a lookup over HTTP (curl), on
# loopback ports given through the environment, as a pod's settings are.
#   deploy/image/check.sh [BIN_DIR]     (default target/release)
# It runs the image with podman (runc: crun refuses some hosts' cgroup
# layout; the host network, so nothing is left behind; the open-file limit
# given, as podman's default is above many hosts' hard limit). Where this
# machine cannot run containers, it unpacks the image's layers (skopeo,
# umoci) and starts the image's entrypoint, user and environment from the
# unpacked root under chroot. Either way a missing library or a wrong
# entrypoint fails it. IMAGE_CHECK=unpacked takes the second way even
# where containers run.
set -euo pipefail
# As root: podman's rootful store and runtime, the unpacked root's owners
# and chroot all need it.
[ "$(id -u)" -eq 0 ] || exec sudo -n -E bash "$0" "$@"
cd "$(dirname "$0")/../.."
bin=${1:-target/release}
start=$(date +%s)
if ! command -v podman >/dev/null || ! command -v umoci >/dev/null || ! command -v skopeo >/dev/null; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq podman runc skopeo umoci >/dev/null
fi
tag=$(bash deploy/image/build.sh "$bin")
# One version everywhere: the binary's (the image's tag), the crates', the
# Python package's and the manifests' image.
version=${tag#prefix-index:}
for file in Cargo.toml client/python/Cargo.toml; do
  v=$(awk -F'"' '/^version = / { print $2; exit }' "$file")
  [ "$v" = "$version" ] || { echo "image: $file says version $v, prefix-server --version $version" >&2; exit 1; }
done
grep -q "image: prefix-index:$version\$" deploy/statefulset.yaml &&
  grep -q "newTag: $version\$" deploy/kustomization.yaml ||
  { echo "image: deploy/ does not name prefix-index:$version" >&2; exit 1; }
size=$(podman image inspect --format '{{.Size}}' "$tag")
echo "image: $tag, $(( (size + 500000) / 1000000 )) MB"

tmp=$(mktemp -d)
name=prefix-index-check-$$
pid=""
cleanup() {
  podman rm -f "$name" >/dev/null 2>&1 || true
  [ -z "$pid" ] || kill "$pid" 2>/dev/null || true
  rm -rf "$tmp"
}
trap cleanup EXIT
read -r quic metrics http < <(python3 - <<'PY'
import socket
socks = []
for kind in (socket.SOCK_DGRAM, socket.SOCK_STREAM, socket.SOCK_STREAM):
    s = socket.socket(socket.AF_INET, kind)
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(*(s.getsockname()[1] for s in socks))
PY
)
env=(PREFIX_INDEX_LISTEN=127.0.0.1:$quic PREFIX_INDEX_METRICS_LISTEN=127.0.0.1:$metrics
     PREFIX_INDEX_HTTP_LISTEN=127.0.0.1:$http)
nofile=$(ulimit -Hn)
[ "$nofile" = unlimited ] && nofile=1048576
mode=container
if [ "${IMAGE_CHECK:-}" = unpacked ] && echo "IMAGE_CHECK=unpacked" >"$tmp/run.err" ||
  ! podman run -d --name "$name" --runtime runc --network host \
    --ulimit "nofile=$nofile:$nofile" --ulimit nproc=32768:32768 \
    "${env[@]/#/--env=}" "$tag" >/dev/null 2>"$tmp/run.err"; then
  echo "image: podman cannot run containers here ($(tail -1 "$tmp/run.err")); starting it from its unpacked layers"
  mode=unpacked
  skopeo copy -q "containers-storage:localhost/$tag" "oci:$tmp/oci:image" 2>"$tmp/skopeo.err" ||
    { cat "$tmp/skopeo.err" >&2; exit 1; }
  umoci unpack --image "$tmp/oci:image" "$tmp/bundle" >/dev/null
  # The image's own entrypoint, user and environment, as a runtime reads
  # them from the bundle, then the loopback ports.
  python3 - "$tmp/bundle/config.json" "$tmp" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))["process"]
out = sys.argv[2]
open(f"{out}/user", "w").write(f'{p["user"]["uid"]}:{p["user"]["gid"]}')
open(f"{out}/env", "w").write("".join(e + "\0" for e in p["env"]))
open(f"{out}/args", "w").write("".join(a + "\0" for a in p["args"]))
PY
  mapfile -d '' -t image_env <"$tmp/env"
  mapfile -d '' -t args <"$tmp/args"
  env -i "${image_env[@]}" "${env[@]}" chroot --userspec="$(cat "$tmp/user")" "$tmp/bundle/rootfs" "${args[@]}" \
    >"$tmp/server.log" 2>&1 &
  pid=$!
fi
logs() {
  if [ "$mode" = container ]; then podman logs "$name" 2>&1 | tail -20; else tail -20 "$tmp/server.log"; fi
}
running() {
  if [ "$mode" = container ]; then
    [ "$(podman inspect --format '{{.State.Running}}' "$name" 2>/dev/null)" = true ]
  else
    kill -0 "$pid" 2>/dev/null
  fi
}
for _ in $(seq 1 100); do
  curl -fsS "http://127.0.0.1:$metrics/healthz" >/dev/null 2>&1 && break
  running || break
  sleep 0.3
done
curl -fsS "http://127.0.0.1:$metrics/healthz" >/dev/null || { echo "image: /healthz never answered" >&2; logs >&2; exit 1; }
if [ "$mode" = container ]; then
  podman cp "$name:/data/cert.pem" "$tmp/cert.pem"
else
  cp "$tmp/bundle/rootfs/data/cert.pem" "$tmp/cert.pem"
fi
text=$(printf 'the image answers %.0s' $(seq 1 8))
client=("$bin/prefix-client" --server "127.0.0.1:$quic" --ca "$tmp/cert.pem")
"${client[@]}" insert --model m --pod image-check --text "$text" >/dev/null
quic_answer=$("${client[@]}" lookup --model m --text "$text")
grep -q image-check <<<"$quic_answer" || { echo "image: QUIC lookup: $quic_answer" >&2; logs >&2; exit 1; }
http_answer=$(curl -fsS --cacert "$tmp/cert.pem" --resolve "localhost:$http:127.0.0.1" \
  "https://localhost:$http/v1/lookup" -d "{\"model\":\"m\",\"text\":\"$text\"}")
grep -q '"pod":"image-check"' <<<"$http_answer" || { echo "image: HTTP lookup: $http_answer" >&2; logs >&2; exit 1; }
echo "image: started ($mode) as $(podman image inspect --format '{{.Config.User}}' "$tag"); /healthz, QUIC and HTTP lookups answered; $(( $(date +%s) - start )) s with the tools' install"
