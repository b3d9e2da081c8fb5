#!/usr/bin/env bash
# Holds docs/openapi.json to the server (CI runs this from .ci/run): a
# maintained validator checks it as OpenAPI 3.1, a maintained generator makes
# a Python client of it, and that client runs against a real prefix-server
# (check.py), every answer checked against the description's schemas.
# Usage: check.sh [prefix-server binary]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
spec="$(realpath "$here/../openapi.json")"
server_bin="$(realpath "${1:-$here/../../target/release/prefix-server}")"

. "$here/../http-server.sh"
make_work_dir

# Both tools pinned: a new release may read the description differently,
# which should be a change of its own, not a CI failure out of nowhere.
python3 -m venv "$work/venv"
pip="$work/venv/bin/pip"
"$pip" install -q --disable-pip-version-check \
  openapi-spec-validator==0.9.0 openapi-python-client==0.29.1
# The generator formats what it writes with the ruff it brought along.
export PATH="$work/venv/bin:$PATH"

openapi-spec-validator "$spec"

# --fail-on-warning: a schema the generator cannot express (and would skip
# or leave untyped) fails the check rather than a gateway's build later.
printf '{"project_name_override": "prefix-index-api", "package_name_override": "prefix_index_api"}\n' \
  >"$work/generator.json"
openapi-python-client generate --path "$spec" --config "$work/generator.json" \
  --output-path "$work/client" --meta setup --fail-on-warning
"$pip" install -q --disable-pip-version-check "$work/client"

# No --client-ca: no roles, so a client without a certificate may do
# everything. Small limits, so that the refusals check.py asks for are small.
data="$work/data"
mkdir "$data"
start_http_server "$server_bin" "$data" --max-key-blocks 8 --max-batch 16

"$work/venv/bin/python" "$here/check.py" "$server_url" "$data/cert.pem" "$spec" ||
  { echo "--- server log"; cat "$data/server.log"; exit 1; }
