#!/usr/bin/env bash
# Server and 10 clients as separate processes over gRPC on loopback.
#   examples/fl/mnist/run_grpc.sh [PORT] [OUT.json]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
port="${1:-8080}"
out="${2:-results/fl/mnist_grpc.json}"
py="${PYTHON:-python}"
"$py" -m plinth.cli.main fl server "$here/grpc.yaml" --address "127.0.0.1:$port" --json "$out" &
server=$!
for cid in $(seq 0 9); do
  "$py" -m plinth.cli.main fl client "$here/grpc.yaml" --server "127.0.0.1:$port" --cid "$cid" \
    > "/tmp/plinth-fl-client-$cid.log" 2>&1 &
done
wait "$server"
wait
