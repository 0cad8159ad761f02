"""The Spooled gRPC API: its definition (spooled.proto) and the stubs generated from it, imported by both the
daemon's gRPC client and the dev server.

`spooled_pb2` needs protobuf, `spooled_pb2_grpc` also grpcio (the `grpc` extra); both are generated (do not
edit them): `python -m supervisor.proto.regenerate` rewrites them, `--check` only compares.
"""
