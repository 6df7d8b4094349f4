#!/usr/bin/env bash
# Regenerate the committed gRPC code from proto/draftgate/v1/target.proto.
#
#   scripts/gen_proto.sh            (uses .venv/bin/python, or $PYTHON)
#
# protoc names the module after the proto's path (draftgate/v1/target_pb2.py); we
# keep the generated files in src/draftgate/server/proto/ and rewrite the one import
# so they load as draftgate.server.proto.target_pb2.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
py="${PYTHON:-$root/.venv/bin/python}"
out="$root/src/draftgate/server/proto"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

"$py" -m grpc_tools.protoc -I "$root/proto" \
  --python_out="$tmp" --pyi_out="$tmp" --grpc_python_out="$tmp" \
  "$root/proto/draftgate/v1/target.proto"

gen="$tmp/draftgate/v1"
cp "$gen/target_pb2.py" "$gen/target_pb2.pyi" "$out/"
sed 's/^from draftgate\.v1 import target_pb2 as/from draftgate.server.proto import target_pb2 as/' \
  "$gen/target_pb2_grpc.py" > "$out/target_pb2_grpc.py"
grep -q '^from draftgate.server.proto import target_pb2 as' "$out/target_pb2_grpc.py" \
  || { echo "gen_proto.sh: could not fix the import in target_pb2_grpc.py" >&2; exit 1; }
echo "generated: $out/target_pb2.py target_pb2.pyi target_pb2_grpc.py"
