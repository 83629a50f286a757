"""The one version of both distributions (the client `ringfence` and the server
`ringfence-server` read it from here), and the one a client sends to the server."""

__version__ = "0.2.0"
