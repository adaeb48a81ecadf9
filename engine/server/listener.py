"""The listening socket of an HTTP server (``engine serve``, ``engine router``), bound before
uvicorn starts so that ``--port 0`` can report the port it got.

Created as a TCP socket by name (``IPPROTO_TCP``): asyncio turns Nagle's algorithm off
(``TCP_NODELAY``) only on connections whose socket says so, and a socket made with
protocol 0 does not. With Nagle on, a response written in two parts (headers, then the
body or the first SSE event) waits for the client's delayed acknowledgement: about 40 ms
on Linux, added to every TTFT.
"""

from __future__ import annotations

import socket


def bind_listener(host: str, port: int) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: a free port), Nagle off, not inherited."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.set_inheritable(False)
    return sock
