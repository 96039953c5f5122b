#!/usr/bin/env bash
# A server and 10 clients as separate processes over gRPC on loopback, with per-client tokens and
# TLS made on the spot (plinth fl tokens, plinth fl certs).
#   examples/fl/mnist/run_grpc.sh [PORT] [OUT.json] [APP.yaml] [ROUNDS]
# APP.yaml defaults to grpc.yaml; dp.yaml, secagg.yaml, app.yaml and robust.yaml run the same way
# (they need 10 clients to start a round).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
port="${1:-8080}"
out="${2:-results/fl/mnist_grpc.json}"
app="${3:-$here/grpc.yaml}"
rounds=()
[ -n "${4:-}" ] && rounds=(--rounds "$4")
clients="${CLIENTS:-10}"
py="${PYTHON:-python}"
secrets="$(mktemp -d)"
trap 'rm -rf "$secrets"' EXIT
"$py" -m plinth.cli.main fl tokens "$secrets/tokens.txt" --clients "$clients" > /dev/null
"$py" -m plinth.cli.main fl certs "$secrets/tls" > /dev/null
"$py" -m plinth.cli.main fl server "$app" --address "127.0.0.1:$port" --json "$out" \
  --tokens "$secrets/tokens.txt" --tls "$secrets/tls" "${rounds[@]}" &
server=$!
for cid in $(seq 0 $((clients - 1))); do
  token="$(awk -v c="$cid" '$1 == c {print $2}' "$secrets/tokens.txt")"
  PLINTH_FL_TOKEN="$token" "$py" -m plinth.cli.main fl client "$app" \
    --server "localhost:$port" --cid "$cid" --tls "$secrets/tls" \
    > "/tmp/plinth-fl-client-$cid.log" 2>&1 &
done
wait "$server"
wait
