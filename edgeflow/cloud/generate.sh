#!/bin/sh
# Regenerate edgeflow_pb2.py and edgeflow_pb2_grpc.py from edgeflow/cloud/edgeflow.proto
# with grpc_tools.protoc (grpcio-tools, in the `test` extra). The proto is compiled from
# the repository root, so the generated stubs import each other as `edgeflow.cloud.*`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-"$root/.venv/bin/python"}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

"$python" -m grpc_tools.protoc -I "$root" --python_out="$scratch" --grpc_python_out="$scratch" \
    "$root/edgeflow/cloud/edgeflow.proto"
cp "$scratch/edgeflow/cloud/edgeflow_pb2.py" "$scratch/edgeflow/cloud/edgeflow_pb2_grpc.py" "$here/"
echo "generated edgeflow_pb2.py and edgeflow_pb2_grpc.py in $here with $("$python" -m grpc_tools.protoc --version)"
