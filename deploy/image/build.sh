#!/usr/bin/env bash
# Builds the prefix-index image from release binaries:
#   deploy/image/build.sh [BIN_DIR]     (default target/release)
# Stages a root with prefix-server and prefix-client (stripped), the shared
# libraries they load (as ldd finds them, at the same paths), and the user
# and group the server runs as, then builds deploy/image/Containerfile on
# it with podman (or docker, when there is no podman). Tags it
# prefix-index:<version>, the version the binary reports. Prints the tag.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${1:-target/release}
builder=${CONTAINER_BUILDER:-$(command -v podman || command -v docker || true)}
[ -n "$builder" ] || { echo "build.sh: neither podman nor docker is installed" >&2; exit 1; }
version=$("$bin/prefix-server" --version | awk '{print $2}')
[ -n "$version" ] || { echo "build.sh: $bin/prefix-server reports no version" >&2; exit 1; }
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT
root=$ctx/rootfs
mkdir -p "$root/usr/bin" "$root/etc" "$root/tmp" "$ctx/data"
chmod 1777 "$root/tmp"
for b in prefix-server prefix-client; do
  strip -o "$root/usr/bin/$b" "$bin/$b"
  # Every library the dynamic loader resolves, the loader included: the
  # path ldd prints, with the file it points to copied in its place.
  ldd "$bin/$b" | awk '/=>/ { print $3 } /^[ \t]*\/[^ ]+ \(/ { print $1 }' | while read -r lib; do
    [ -e "$lib" ] || { echo "build.sh: $b needs $lib, which is not here" >&2; exit 1; }
    mkdir -p "$root$(dirname "$lib")"
    cp -L "$lib" "$root$lib"
  done
done
cat >"$root/etc/passwd" <<'PASSWD'
root:x:0:0:root:/root:/sbin/nologin
nonroot:x:65532:65532:prefix-index:/data:/sbin/nologin
PASSWD
cat >"$root/etc/group" <<'GROUP'
root:x:0:
nonroot:x:65532:
GROUP
# What the image holds, for the build's log.
(cd "$root" && find . -type f -printf '%9s  /%P\n' | sort -k2) >&2
tag=prefix-index:$version
"$builder" build --quiet --file "$here/Containerfile" --tag "$tag" \
  --label org.opencontainers.image.version="$version" \
  --label org.opencontainers.image.title=prefix-index \
  "$ctx" >/dev/null
echo "$tag"
