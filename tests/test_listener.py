"""The servers' listening socket: connections it accepts have Nagle's algorithm off.

With Nagle on, a response written in two parts waits ~40 ms for the client's
delayed acknowledgement; every non-streamed answer and the first SSE event paid it.
"""

from __future__ import annotations

import asyncio
import socket
import statistics
import time

import httpx
from conftest import Server

from engine.server.listener import bind_listener


def test_accepted_connections_have_nodelay() -> None:
    async def main() -> int:
        accepted: asyncio.Future[int] = asyncio.get_running_loop().create_future()

        def on_connect(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            sock = writer.get_extra_info("socket")
            accepted.set_result(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()

        listener = bind_listener("127.0.0.1", 0)
        server = await asyncio.start_server(on_connect, sock=listener)
        port = listener.getsockname()[1]
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        nodelay = await asyncio.wait_for(accepted, 10)
        writer.close()
        server.close()
        await server.wait_closed()
        return nodelay

    assert asyncio.run(main()) == 1


def test_a_small_answer_takes_no_delayed_ack(server: Server) -> None:
    """GET /health on a live server: well under the ~40 ms a delayed acknowledgement costs."""
    with httpx.Client(timeout=10) as client:
        client.get(f"{server.url}/health")
        times = []
        for _ in range(20):
            start = time.perf_counter()
            assert client.get(f"{server.url}/health").status_code == 200
            times.append(time.perf_counter() - start)
    assert statistics.median(times) < 0.02
