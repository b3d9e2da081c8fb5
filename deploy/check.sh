#!/usr/bin/env bash
# Holds the manifests in deploy/ to Kubernetes and to the server (CI runs
# this from .ci/run): every file kustomization.yaml lists validates
# strictly against a pinned Kubernetes version's schemas, and the server
# starts as statefulset.yaml runs it, with the ConfigMap's settings and a
# TLS Secret made by the recipe of docs/operations.md (check.py).
# Usage: check.sh [prefix-server binary]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
server_bin="$(realpath "${1:-$here/../target/release/prefix-server}")"

# The validator pinned, and the Kubernetes version it checks against (one
# of the schemas it bundles): a new release may read the manifests
# differently, which should be a change of its own.
validator=kubernetes-validate==1.37.0
kubernetes=1.33.0

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

python3 -m venv "$work/venv"
"$work/venv/bin/pip" install -q --disable-pip-version-check "$validator"

# The Secret prefix-index-tls's files, made as docs/operations.md says.
mkdir "$work/tls"
awk '/<!-- recipe: kubernetes-tls -->/ { on = 1; next }
     on && /^```sh$/ { next }
     on && /^```$/ { exit }
     on' "$here/../docs/operations.md" >"$work/tls.sh"
[ -s "$work/tls.sh" ] || { echo "deploy: no kubernetes-tls recipe in docs/operations.md"; exit 1; }
(cd "$work/tls" && bash -euo pipefail "$work/tls.sh" >"$work/tls.log" 2>&1) ||
  { echo "deploy: the TLS recipe failed"; cat "$work/tls.log"; exit 1; }

"$work/venv/bin/python" "$here/check.py" "$server_bin" "$work" "$work/tls" "$kubernetes"
