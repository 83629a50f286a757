"""MCP servers declared by the operator, run in session sandboxes (docs/mcp-servers.md).

    declaration.py   a server's folder (server.toml + the pinned tools.json) -> its tools'
                     manifests, registered as SERVER.TOOL
    pinning.py       tools.json from the server itself, started in a session sandbox; the
                     drift check `ringfence tools check` runs
    scaffold.py      `ringfence mcp-servers add`: the image spec (the package's wheels pinned by
                     hash) and the declaration
"""
