"""Serves an MCP server over Streamable HTTP on 127.0.0.1 for Choir's tests:
`serve_http.py time` (the reference mcp-server-time, with UTC as its local
zone) or `serve_http.py MODE` (a server of hostile.py). It binds a port the
kernel chooses and prints it on its first line of stdout before serving, so
no other test can take the port between a choice and a bind."""

import socket
import sys

import uvicorn

which = sys.argv[1]
if which == "time":
    from mcp_server_time.server import create_server

    server = create_server("UTC")
else:
    sys.argv = [sys.argv[0], which]
    import hostile

    server = hostile.server

sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
sock.bind(("127.0.0.1", 0))
sock.listen(64)
print(sock.getsockname()[1], flush=True)
app = server.streamable_http_app(host="127.0.0.1")
uvicorn.Server(uvicorn.Config(app, log_level="warning")).run(sockets=[sock])
