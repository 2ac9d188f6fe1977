"""Serves an MCP server over Streamable HTTP on 127.0.0.1:PORT for Choir's
tests: `serve_http.py PORT time` (the reference mcp-server-time, with UTC as
its local zone) or `serve_http.py PORT MODE` (a server of hostile.py)."""

import sys

port, which = int(sys.argv[1]), sys.argv[2]
if which == "time":
    from mcp_server_time.server import create_server

    server = create_server("UTC")
else:
    sys.argv = [sys.argv[0], which]
    import hostile

    server = hostile.server

server.run("streamable-http", host="127.0.0.1", port=port)
