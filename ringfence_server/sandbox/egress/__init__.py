"""Egress for tools that declare it: an allowlisting proxy and the only network way out.

    classify_address(ip) -> AddressClass          ringfence_server.sandbox.egress.addresses (no sockets)
    host_allowed(host, port, patterns) -> bool     ringfence_server.sandbox.egress.allowlist
    intersect(tool_patterns, granted) -> patterns  a call's allowlist = tool AND policy
    EgressGrant(allow, max_bytes, max_connections) the SandboxProfile.egress field
    EgressProxy(client, lock, settings)            ringfence_server.sandbox.egress.proxy: proxy container,
                                                   each call's own socket and credentials
    relay (run inside the sandbox)                 ringfence_server.sandbox.egress.relay: 127.0.0.1:3128 ->
                                                   the call's socket (stdlib only)
    ProxySettings(services={name: (address,)},     operator-declared internal services (the
                  service_networks=(network,))     ledger): a name pinned to its container's
                                                   address, never resolved, that address
                                                   permitted for that name only

Errors: EgressError (an EngineError: transient) when the proxy cannot be started or reached;
ProfileError for a malformed grant.

The proxy itself runs in its own container, stdlib only, from these very files (the egress-proxy
image's image.json `files` lays them as the package `rfegress`; they import each other
relatively), so a change to any of them needs `ringfence images build --update-lock egress-proxy`:

    server       the listeners and each connection's course; main()
    admission    every allow/deny decision, pure (no I/O, no socket import)
    http1        request heads, host:port, refusals, the forwarded head
    grant_table  the per-call grants: credentials, ceilings, cut_all
    pump         bytes between client and upstream, charged to the call's budget
    control      the control channel (its host end: ringfence_server.sandbox.egress.channel)
    config       ProxyConfig and services;  events  the request event and JSON log
    errors       Deny and Cut;  addresses, allowlist, tlspeek  as above and the ClientHello peek

Test support (the proxy harness, decoys, the Docker testbed) lives in tests/egress_support.
"""

from ringfence_server.sandbox.egress.addresses import AddressClass, address_permitted, classify_address
from ringfence_server.sandbox.egress.allowlist import HostPattern, PatternError, host_allowed, intersect, parse_pattern
from ringfence_server.sandbox.egress.grant import EgressGrant

__all__ = [
    "AddressClass",
    "EgressGrant",
    "HostPattern",
    "PatternError",
    "address_permitted",
    "classify_address",
    "host_allowed",
    "intersect",
    "parse_pattern",
]
