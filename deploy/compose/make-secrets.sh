#!/bin/sh
# The Lagos compose topology's secrets: the edge's TLS certificate (from a cluster CA) and its API-key store.
#   deploy/compose/make-secrets.sh [FOLDER]      (default: deploy/compose/secrets; needs `nearshore` on PATH)
set -eu
out="${1:-$(dirname "$0")/secrets}"
mkdir -p "$out"
nearshore ca init --dir "$out/ca"
nearshore ca issue lagos-edge --dir "$out/ca" --out "$out" --server --host localhost --host 127.0.0.1 --host edge
nearshore keys create --tenant demo --db "$out/keys.sqlite3"
# Compose (without swarm) bind-mounts secret files with their host mode; the edge runs as uid 10001.
chmod 0644 "$out/lagos-edge.pem" "$out/lagos-edge-key.pem" "$out/keys.sqlite3"
