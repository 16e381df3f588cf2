#!/usr/bin/env bash
# Regenerates the gRPC stubs in fleetwire/v1 and fleetwire/kserve from proto/. OUT_DIR overrides the
# destination root, which the staleness check uses to compare without touching the tree.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
export PATH="$(dirname "$PY"):$PATH"
OUT="${OUT_DIR:-.}"
mkdir -p "$OUT/fleetwire/v1" "$OUT/fleetwire/kserve"
"$PY" -m grpc_tools.protoc -Iproto \
  --python_out="$OUT" --grpc_python_out="$OUT" --mypy_out="$OUT" --mypy_grpc_out="$OUT" \
  proto/fleetwire/v1/*.proto proto/fleetwire/kserve/*.proto
