"""Generated stubs of supervisor/proto/spooled.proto (do not edit; see regenerate.py).

Importing `spooled_pb2` needs protobuf; `spooled_pb2_grpc` also needs grpcio (the `grpc` extra).
"""
