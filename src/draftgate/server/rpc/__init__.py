"""The split deployment's wire layer: gRPC target worker and client, HTTP draft worker and client.

Modules (import them by full path; this package imports nothing on its own):

- ``host``: the target worker's core (sessions, KV, batched exact verification), no gRPC;
- ``target_server``: the gRPC edge of ``host`` (``draftgate serve-target``);
- ``client``: ``RemoteTargetEngine``, the engine's API with the target on workers;
- ``pool``: workers as a client sees them (least-loaded choice, health, back-off);
- ``draft_worker`` / ``draft_client``: ``draftgate serve-draft`` and ``HttpDrafter``;
- ``wire``: protobuf <-> internal types; ``factory``: build the parts from config;
- ``target_pb2*``: generated from proto/draftgate/v1/target.proto by scripts/gen_proto.sh.
"""
