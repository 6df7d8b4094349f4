"""The gRPC wire between the gateway and its target workers.

- ``target_pb2*``: generated from proto/draftgate/v1/target.proto by scripts/gen_proto.sh;
- ``wire``: protobuf <-> internal types (both sides convert here, at the edge only).
"""
