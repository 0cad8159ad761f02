"""The Spooled gRPC API definition (spooled.proto); its Python stubs live in supervisor.devserver.grpc_gen."""
