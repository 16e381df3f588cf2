#!/usr/bin/env bash
# Fails when regenerating the stubs from proto/ would change the committed ones.
set -euo pipefail
cd "$(dirname "$0")/.."
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
OUT_DIR="$tmp" scripts/gen_proto.sh >/dev/null
for f in "$tmp"/fleetwire/v1/* "$tmp"/fleetwire/kserve/*; do
  name="${f#"$tmp"/}"
  if ! cmp -s "$f" "$name"; then
    echo "stale generated stub: $name (run 'make proto' and commit)" >&2
    exit 1
  fi
done
echo "gRPC stubs are up to date"
