#!/bin/sh
# Regenerate the Python code of edgeflow/cloud/edgeflow.proto (edgeflow_pb2.py,
# edgeflow_pb2_grpc.py) and edgeflow/cloud/ps.proto (ps_pb2.py, ps_pb2_grpc.py) with
# grpc_tools.protoc (grpcio-tools, in the `test` extra). The protos are compiled from the
# repository root, so the generated stubs import each other as `edgeflow.cloud.*`.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
python=${PYTHON:-"$root/.venv/bin/python"}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

"$python" -m grpc_tools.protoc -I "$root" --python_out="$scratch" --grpc_python_out="$scratch" \
    "$root/edgeflow/cloud/edgeflow.proto" "$root/edgeflow/cloud/ps.proto"
for name in edgeflow ps; do
    cp "$scratch/edgeflow/cloud/${name}_pb2.py" "$scratch/edgeflow/cloud/${name}_pb2_grpc.py" "$here/"
done
echo "generated edgeflow_pb2*.py and ps_pb2*.py in $here with $("$python" -m grpc_tools.protoc --version)"
