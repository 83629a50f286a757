"""The wire: ringfence.v1 messages to ringfence.model values and back (convert, plans_convert,
routing_convert), the table between ringfence.errors and gRPC status codes (status), and the
version handshake's rule (version).

Shared by the SDK and the server (which decodes requests with the same functions), so both
sides of the wire agree by construction. Agent code uses the clients, not these.
"""
