#!/bin/sh
# The Lagos compose topology's secrets: the edge's TLS certificate (from a cluster CA), the PostgreSQL password
# (the server's secret, and the edge's PGPASSWORD) and the admin API's token (edge.env). Keys are made in
# PostgreSQL once the stack is up (`... exec edge nearshore keys create --tenant demo --postgres ...`).
#   deploy/compose/make-secrets.sh [FOLDER]      (default: deploy/compose/secrets; needs `nearshore` on PATH)
set -eu
out="${1:-$(dirname "$0")/secrets}"
mkdir -p "$out"
nearshore ca init --dir "$out/ca"
nearshore ca issue lagos-edge --dir "$out/ca" --out "$out" --server --host localhost --host 127.0.0.1 --host edge
password="$(python3 -c 'import secrets; print(secrets.token_urlsafe(24))')"
token="$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')"
printf '%s' "$password" > "$out/postgres-password"
printf 'PGPASSWORD=%s\nNEARSHORE_ADMIN_TOKEN=%s\n' "$password" "$token" > "$out/edge.env"
# Compose (without swarm) bind-mounts secret files with their host mode; the edge runs as uid 10001.
chmod 0644 "$out/lagos-edge.pem" "$out/lagos-edge-key.pem" "$out/postgres-password"
chmod 0600 "$out/edge.env"
