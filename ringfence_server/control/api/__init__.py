"""The gRPC edge of the control plane: the only code that sees protobufs.

    protos_gen   `make protos`: protos/ringfence/v1/*.proto -> client/ringfence/v1 (committed)
    gen/         generated modules; never edited by hand
    convert      proto <-> ringfence.model dataclasses; strict request decoding
    status       the one table: ringfence.errors <-> gRPC status + google.rpc.BadRequest
    auth         bearer tokens (sha256 in config) and the role each RPC needs
    core         the Core protocol: what the edge calls on the orchestrator, typed
    servicer     the ringfence.v1 services on grpc.aio, one wrapper around every RPC
    server       create_server(address, orchestrator, config) -> (server, port)
    background   the server on a background event loop (tests, in-process demos)
    client       Client: a small typed synchronous client
    serve        `ringfence serve`

Nothing is imported here, so `import ringfence_server.control.api.serve` (the CLI) stays cheap.
"""
